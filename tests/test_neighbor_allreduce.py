"""neighbor_allreduce: the fused parameter buffers, the checks that run before any
communication, the exchange against the dense reference W @ X for n = 2..8 over both
CPU transports (through mpiexec), and whole runs of `python -m commbench`."""

import dataclasses

import pytest

from commbench.config.run_config import RunConfig
from commbench.errors import UsageError
from commbench.launch.distributed import DistContext
from commbench.launch.detect import LaunchInfo
from commbench.optimizers.neighbor_allreduce import NeighborAllreduce
from commbench.comm.transport import mpi_ready
from programs.check_strategies import CHECKS_TIMEOUT, assert_strategy_clean
from programs.commbench_runs import assert_usage_error, consensus_of, run_commbench

STRATEGY = "neighbor_allreduce"


def launch(n):
    return LaunchInfo("openmpi", 0, n, 0, n, 0)


def context(n, machine_size=None, hostnames=None):
    """A DistContext as init_distributed builds it, without any process group."""
    hostnames = tuple(hostnames or ["host"] * n)
    return DistContext(launch(n), "cpu", "gloo", hostnames,
                       machine_size if machine_size is not None else n,
                       machine_size is not None)


# --- fused buffers (in process) ---------------------------------------------------


def test_parameters_become_views_into_one_buffer_per_dtype():
    import torch

    from commbench.comm.fused import fuse_parameters

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model.extra = torch.nn.Parameter(torch.arange(3, dtype=torch.float64))
    before = [p.detach().clone() for p in model.parameters()]
    buffers = {b.dtype: b for b in fuse_parameters(model)}
    assert sorted(buffers, key=str) == [torch.float32, torch.float64]
    single = buffers[torch.float32]
    assert single.numel() == 3 * 4 + 4 + 4 * 2 + 2
    for p, old in zip(model.parameters(), before):
        assert torch.equal(p, old)  # values kept
    single.fill_(0.5)  # a write into the buffer is a write into the model
    assert all(bool((p == 0.5).all()) for p in model.parameters() if p.dtype == torch.float32)
    assert single.data_ptr() == model[0].weight.data_ptr()

    # Training still works and updates the buffer in place.
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    assert not bool((single == 0.5).all())
    assert single.data_ptr() == model[0].weight.data_ptr()


def test_parameters_move_into_buffers_kept_elsewhere():
    """A mixer that keeps the buffers elsewhere (in shared memory) gets the parameters
    moved there, values and training intact."""
    import torch

    from commbench.comm.fused import fuse_parameters

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model.extra = torch.nn.Parameter(torch.arange(3, dtype=torch.float64))
    before = [p.detach().clone() for p in model.parameters()]
    first = fuse_parameters(model)
    elsewhere = [torch.zeros_like(b) for b in first]
    assert fuse_parameters(model, into=elsewhere) == elsewhere
    for p, old in zip(model.parameters(), before):
        assert torch.equal(p, old)
    assert {b.data_ptr() for b in elsewhere} == \
        {model[0].weight.data_ptr(), model.extra.data_ptr()}
    snapshot = [b.clone() for b in elsewhere]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    k = next(i for i, b in enumerate(elsewhere) if b.dtype == torch.float32)
    assert not torch.equal(elsewhere[k], snapshot[k])  # the step wrote there


# --- checks before communication (in process) ------------------------------------


@pytest.mark.parametrize("flags, message", [
    (dict(topology="hypercube"), "argument --topology: unknown topology 'hypercube'"),
    (dict(topology="exponential-1"), "argument --topology: topology 'exponential-1': the base"),
    (dict(topology="star"), "argument --topology: topology 'star' has no dynamic schedule"),
    (dict(topology="mesh-2d"), "argument --topology: topology 'mesh-2d' has no dynamic"),
    (dict(machine_size=3), "argument --machine-size: 3 does not divide the 4 ranks"),
])
def test_check_rejects_impossible_requests_in_one_line(flags, message):
    with pytest.raises(UsageError) as caught:
        NeighborAllreduce.check(RunConfig(dist_optimizer=STRATEGY, **flags), launch(4))
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("flags", [
    dict(), dict(topology="star", disable_dynamic_topology=True),
    dict(topology="mesh-2d", disable_dynamic_topology=True), dict(topology="ring"),
    dict(topology="exponential-3", atc_style=True), dict(machine_size=2),
])
def test_check_accepts_possible_requests(flags):
    NeighborAllreduce.check(RunConfig(dist_optimizer=STRATEGY, **flags), launch(4))


def test_facts_and_schedule_follow_bluefogs_benchmark():
    one_machine = NeighborAllreduce(context(8), RunConfig())
    assert one_machine.facts() == dict(
        topology="exponential-2", dynamic=True, schedule="one-peer", schedule_period=3,
        style="awc", fp16=False, compression="none", transport="gloo",
        transport_reason="--cpu-transport auto without an MPI launcher",
        small_message_transport=None, small_message_bytes=None, message_bytes=1 << 20,
        spectral_gap=pytest.approx(0.5),
        machine_size=8,
        num_machines=1, simulated_machines=False)
    # Several equal machines: Bluefog's inner-outer schedule (it needs >= 3 per machine).
    assert NeighborAllreduce(context(8, 4), RunConfig()).facts()["schedule"] == "inner-outer"
    assert NeighborAllreduce(context(8, 2), RunConfig()).facts()["schedule"] == "one-peer"
    unequal = context(5, 0, ["a", "a", "a", "b", "b"])  # machines of unequal size
    assert NeighborAllreduce(unequal, RunConfig()).facts()["schedule"] == "one-peer"
    static = NeighborAllreduce(context(8, 4), RunConfig(disable_dynamic_topology=True,
                                                        atc_style=True, fp16_allreduce=True))
    assert (static.facts()["schedule"], static.facts()["dynamic"], static.facts()["style"],
            static.facts()["fp16"]) == ("static", False, "atc", True)


def test_cpu_transport_mpi_needs_an_mpi_launcher_in_one_line(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "__version__", "2.14.1")  # NCCL below: torch 1.10 refuses it
    # Before init: not started by an MPI launcher.
    with pytest.raises(UsageError) as caught:
        NeighborAllreduce.check(RunConfig(cpu_transport="mpi"),
                                LaunchInfo("torchrun", 0, 4, 0, 4, 0))
    assert str(caught.value).startswith("argument --cpu-transport: mpi needs")
    assert "\n" not in str(caught.value)
    # After init: an MPI launcher, but mpi4py was not set up (no MPI rendezvous).
    if not mpi_ready():
        with pytest.raises(UsageError, match="^argument --cpu-transport: mpi needs"):
            NeighborAllreduce(context(4), RunConfig(cpu_transport="mpi"))
    # auto falls back to the process group; GPU tensors always use it.
    gpu = dataclasses.replace(context(4), device=FakeDevice("cuda"), backend="nccl")
    assert NeighborAllreduce(gpu, RunConfig(cpu_transport="mpi")).facts()["transport"] == "nccl"
    assert NeighborAllreduce(context(4), RunConfig(cpu_transport="gloo")).transport == "gloo"


class FakeDevice:
    def __init__(self, kind):
        self.type = kind


# --- through mpiexec --------------------------------------------------------------


@pytest.mark.timeout(CHECKS_TIMEOUT)
@pytest.mark.mpi
@pytest.mark.parametrize("n", range(2, 9))
def test_exchange_equals_dense_reference(n):
    """Static topologies, dynamic schedules (one-peer, inner-outer on simulated
    machines), fp16, exact averaging of one-peer exponential-2 in log2 n steps, and
    AWC/ATC against their closed forms, each over both CPU transports (gloo, mpi):
    tests/programs/check_strategies.py."""
    assert_strategy_clean(n, STRATEGY)


@pytest.mark.mpi
def test_run_records_loss_and_consensus(tmp_path):
    doc = run_commbench(4, STRATEGY, [], tmp_path)
    assert doc["strategy"]["schedule"] == "one-peer" and doc["strategy"]["style"] == "awc"
    assert all(c >= 0 for c in consensus_of(doc))


@pytest.mark.mpi
def test_consensus_distance_shrinks_without_learning(tmp_path):
    # Static ring on 4 workers: every eigenvalue of W but the average's is +-1/3, so
    # each step multiplies the (squared) consensus distance by exactly 1/9, and an
    # iteration of 2 batches by 1/81.
    doc = run_commbench(4, STRATEGY, ["--lr", "0", "--independent-init", "--topology", "ring",
                                      "--disable-dynamic-topology", "--atc-style"], tmp_path)
    consensus = consensus_of(doc)
    assert 0 < consensus[2] < consensus[1] < consensus[0], consensus
    assert consensus[1] / consensus[0] == pytest.approx(1 / 81, rel=0.05)
    assert consensus[2] / consensus[1] == pytest.approx(1 / 81, rel=0.05)


@pytest.mark.mpi
@pytest.mark.parametrize("n, flags, message", [
    (2, ["--topology", "hypercube"], "argument --topology: unknown topology 'hypercube'"),
    (4, ["--topology", "star"], "argument --topology: topology 'star' has no dynamic schedule"),
])
def test_bad_input_fails_fast_on_every_rank(tmp_path, n, flags, message):
    assert_usage_error(n, ["--dist-optimizer", STRATEGY, *flags], message, tmp_path)
