"""hierarchical_neighbor_allreduce: machines (real or simulated with --machine-size)
as super-nodes. Checks before communication, the step against the dense reference
(W_M kron J_L/L) @ X for n = 2..8 and every machine size that divides n (through
mpiexec), and whole runs of `python -m commbench`."""

import pytest

from commbench.config.run_config import RunConfig
from commbench.errors import UsageError
from commbench.launch.distributed import DistContext
from commbench.launch.detect import LaunchInfo
from commbench.optimizers.hierarchical_neighbor_allreduce import HierarchicalNeighborAllreduce
from programs.check_strategies import CHECKS_TIMEOUT, assert_strategy_clean
from cli_helpers import commbench
from programs.commbench_runs import assert_usage_error, consensus_of, run_commbench

STRATEGY = "hierarchical_neighbor_allreduce"


def launch(n):
    return LaunchInfo("openmpi", 0, n, 0, n, 0)


def context(hostnames, machine_size, simulated=False):
    n = len(hostnames)
    return DistContext(launch(n), "cpu", "gloo", tuple(hostnames), machine_size, simulated)


@pytest.mark.parametrize("flags, message", [
    (dict(machine_size=3), "argument --machine-size: 3 does not divide the 4 ranks"),
    (dict(topology="hypercube"), "argument --topology: unknown topology 'hypercube'"),
    (dict(topology="star", machine_size=2), "argument --topology: topology 'star' has no dynamic"),
    (dict(), "argument --machine-size: hierarchical_neighbor_allreduce needs at least 2 machines"),
    (dict(machine_size=4), "argument --machine-size: hierarchical_neighbor_allreduce needs at "
                           "least 2 machines, but all 4 ranks are on one"),
])
def test_check_rejects_impossible_requests_in_one_line(flags, message):
    with pytest.raises(UsageError) as caught:
        HierarchicalNeighborAllreduce.check(RunConfig(dist_optimizer=STRATEGY, **flags), launch(4))
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_two_simulated_machines_pass_the_check():
    HierarchicalNeighborAllreduce.check(RunConfig(dist_optimizer=STRATEGY, machine_size=2),
                                        launch(4))


def test_unequal_machines_are_refused_on_every_rank():
    # Known only after rendezvous (from all hostnames, identical on every rank).
    unequal = context(["a", "a", "a", "b"], 0)
    with pytest.raises(UsageError, match="same number of ranks on every machine.*--machine-size"):
        HierarchicalNeighborAllreduce(unequal, RunConfig(dist_optimizer=STRATEGY))


def test_machines_are_the_nodes_of_the_topology():
    four_machines = context(["a", "a", "b", "b", "c", "c", "d", "d"], 2)
    plugin = HierarchicalNeighborAllreduce(four_machines, RunConfig(dist_optimizer=STRATEGY))
    facts = plugin.facts()
    assert (facts["num_machines"], facts["machine_size"], facts["schedule"]) == (4, 2, "one-peer")
    assert plugin.schedule.size == 4 and plugin.schedule.period == 2  # shifts 1, 2 over 4
    static = HierarchicalNeighborAllreduce(context(["h"] * 6, 3, simulated=True),
                                           RunConfig(disable_dynamic_topology=True))
    assert static.facts()["schedule"] == "static" and static.facts()["simulated_machines"]


@pytest.mark.timeout(CHECKS_TIMEOUT)
@pytest.mark.mpi
@pytest.mark.parametrize("n", range(2, 9))
def test_step_equals_dense_reference(n):
    """Every machine size dividing n; static and dynamic; AWC (copy) and ATC (in place);
    fp16; AWC/ATC closed forms: tests/programs/check_strategies.py."""
    assert_strategy_clean(n, STRATEGY)


@pytest.mark.mpi
def test_run_with_simulated_machines_reaches_consensus(tmp_path):
    # Two simulated machines of two: exponential-2 over 2 machines averages exactly,
    # so from independent starts the workers agree from the first iteration on.
    doc = run_commbench(4, STRATEGY, ["--machine-size", "2", "--lr", "0", "--independent-init"],
                        tmp_path)
    assert (doc["strategy"]["num_machines"], doc["strategy"]["simulated_machines"]) == (2, True)
    consensus = consensus_of(doc)
    assert consensus[0] < 1e-10 and all(later <= consensus[0] + 1e-12 for later in consensus)


@pytest.mark.mpi
def test_bad_machine_size_fails_fast_on_every_rank(tmp_path):
    assert_usage_error(4, ["--dist-optimizer", STRATEGY, "--machine-size", "3"],
                       "argument --machine-size: 3 does not divide the 4 ranks", tmp_path)


# --- --machine-size for every strategy ---------------------------------------------

@pytest.mark.parametrize("strategy", ["allreduce", "none", "diloco", "gradient_allreduce"])
def test_machine_size_for_a_strategy_without_machines_is_one_line_exit_2(strategy, tmp_path):
    done = commbench("--dist-optimizer", strategy, "--machine-size", "3", "--results-dir",
                     str(tmp_path))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == (f"commbench: error: argument --machine-size: means nothing to "
                           f"{strategy}, which groups no ranks into machines; leave it out "
                           "(the neighbor averaging strategies and local_sgd's "
                           "--average-every h1,h2 read it)\n")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("strategy", ["neighbor_allreduce", "local_sgd"])
def test_machine_size_that_does_not_divide_the_ranks_is_refused(strategy):
    from commbench import registry

    with pytest.raises(UsageError, match="^argument --machine-size: 3 does not divide the 2 "):
        registry.resolve(strategy).check(
            RunConfig(dist_optimizer=strategy, machine_size=3), launch(2))
