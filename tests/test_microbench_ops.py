"""Microbench ops from plugins (commbench.microbench.ops): found through the entry-point
group `commbench.microbench_ops` beside commbench's own; a name taken twice, or a plugin
op that is no Op, is one line. tests/test_plugin_discovery.py runs an installed one."""

from types import SimpleNamespace

import pytest

from cli_helpers import commbench
from commbench import registry
from commbench.microbench import ops


class NotAnOp:
    name = "allreduce"


@pytest.fixture
def plugin_ops(monkeypatch):
    """Installs the ops named (name -> target) in the microbench group, for this test."""
    real = registry._entry_points
    declared = {}

    def entry_points(group):
        if group != ops.GROUP:
            return real(group)
        return [SimpleNamespace(name=name, value=target, dist=None)
                for name, target in declared.items()]

    monkeypatch.setattr(registry, "_entry_points", entry_points)
    return declared


def test_a_plugins_op_is_an_op_of_its_own(plugin_ops):
    plugin_ops["local_twice"] = "commbench.microbench.ops.local_sgd:LocalSgd"
    assert ops.names() == [*ops.OPS, "local_twice"]
    assert ops.find("local_twice") is ops.OPS["local_sgd"]
    done = commbench("microbench", "--help")
    assert done.returncode == 0 and "local_sgd, local_twice" in " ".join(done.stdout.split())


def test_a_plugins_op_of_a_name_commbench_has_is_one_line(plugin_ops):
    plugin_ops["allreduce"] = "test_microbench_ops:NotAnOp"
    done = commbench("microbench", "--help")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "commbench: error: two microbench ops are named 'allreduce': commbench's and "
        "test_microbench_ops:NotAnOp (?)"]


def test_a_plugins_op_that_is_no_op_is_one_line_before_any_job(plugin_ops):
    plugin_ops["not_an_op"] = "test_microbench_ops:NotAnOp"
    done = commbench("microbench", "--op", "not_an_op")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "commbench: error: microbench op 'not_an_op' is not a "
        "commbench.microbench.ops.base.Op"]
