"""Which transport `--cpu-transport auto` picks on each path, and why the result says:
MPI for point-to-point messages and for collectives on one machine, gloo for an
allreduce between machines; an explicit choice is kept."""

from types import SimpleNamespace

import pytest

from commbench.comm import transport


def job(hosts, mpi=True, device="cpu"):
    return SimpleNamespace(device=device, backend="gloo" if device == "cpu" else "nccl",
                           hostnames=tuple(hosts), launch=SimpleNamespace(mpi=mpi))


@pytest.fixture
def mpi_up(monkeypatch):
    monkeypatch.setattr(transport, "mpi_ready", lambda: True)


@pytest.mark.parametrize("hosts, collective, picked", [
    (["a", "a"], False, "mpi"),  # neighbor exchange on shared memory
    (["a", "a"], True, "mpi"),  # allreduce on shared memory
    (["a", "b"], False, "mpi"),  # neighbor exchange between machines
    (["a", "b"], True, "gloo"),  # allreduce between machines: gloo's ring
    (["a", "a", "b", "b"], True, "gloo"),
])
def test_auto_picks_per_path(mpi_up, hosts, collective, picked):
    ctx = job(hosts)
    chosen = transport.choose_transport("auto", ctx, collective=collective)
    assert chosen == picked
    why = transport.transport_reason("auto", chosen, ctx)
    assert why == ("--cpu-transport auto under an MPI launcher" if picked == "mpi" else
                   "--cpu-transport auto for an allreduce between machines")


@pytest.mark.parametrize("choice", ["mpi", "gloo"])
def test_an_explicit_choice_is_kept_between_machines(mpi_up, choice):
    ctx = job(["a", "b"])
    assert transport.choose_transport(choice, ctx, collective=True) == choice
    assert transport.transport_reason(choice, choice, ctx) == f"--cpu-transport {choice}"


def test_without_an_mpi_launcher_auto_is_the_process_group(monkeypatch):
    monkeypatch.setattr(transport, "mpi_ready", lambda: False)
    ctx = job(["a", "a"], mpi=False)
    assert transport.choose_transport("auto", ctx) == "gloo"
    assert transport.transport_reason("auto", "gloo", ctx) == \
        "--cpu-transport auto without an MPI launcher"
    with pytest.raises(Exception, match="mpi needs a job started by an MPI launcher"):
        transport.choose_transport("mpi", ctx)


def test_gpu_tensors_go_through_the_process_group(mpi_up):
    ctx = job(["a", "b"], device="cuda")
    assert transport.choose_transport("auto", ctx, collective=True) == "nccl"
    assert transport.transport_reason("auto", "nccl", ctx) == "GPU tensors"
