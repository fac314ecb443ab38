"""gradient_allreduce (Bluefog's gradient averaging): gradients equal the mean over
workers for n = 2..8 (through mpiexec), a whole run of `python -m commbench`, and the
names of Bluefog's benchmark resolving to plugins."""

import pytest

from commbench import registry
from programs.check_strategies import CHECKS_TIMEOUT, assert_strategy_clean
from programs.commbench_runs import run_commbench

STRATEGY = "gradient_allreduce"


@pytest.mark.parametrize("name", ["allreduce", "gradient_allreduce", "neighbor_allreduce",
                                  "hierarchical_neighbor_allreduce"])
def test_bluefog_benchmark_names_resolve(name):
    # Bluefog's --dist-optimizer names, but win_put (one-sided windows, out of scope)
    # and horovod (its own plugin).
    cls = registry.resolve(name)
    assert cls.name == name and registry.usable_reason(cls) is None


def test_only_the_neighbor_strategies_are_decentralized():
    assert not registry.resolve(STRATEGY).decentralized
    assert registry.resolve("neighbor_allreduce").decentralized
    assert registry.resolve("hierarchical_neighbor_allreduce").decentralized


@pytest.mark.timeout(CHECKS_TIMEOUT)
@pytest.mark.mpi
@pytest.mark.parametrize("n", range(2, 9))
def test_gradients_equal_their_mean(n):
    """Float32 and fp16; the step moves by -lr times the mean (and DDP's `allreduce`
    likewise): tests/programs/check_strategies.py."""
    assert_strategy_clean(n, STRATEGY)


@pytest.mark.mpi
def test_run_keeps_workers_identical(tmp_path):
    # Started apart on purpose: the plugin starts everyone from rank 0's model, as
    # Bluefog's benchmark does, and averaged gradients keep them together.
    doc = run_commbench(4, STRATEGY, ["--independent-init"], tmp_path)
    assert doc["summary"]["parameters_identical"]
    assert doc["samples"]["consensus_distance"] is None  # not decentralized: nothing to record
