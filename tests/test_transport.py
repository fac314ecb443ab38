"""Which transport `--cpu-transport auto` picks, and why the result says: MPI when
every rank is on one machine, gloo between machines but MPI for small messages there
(while every rank has a core, else only point-to-point messages sent eagerly); an
explicit choice is kept."""

from types import SimpleNamespace

import pytest

from commbench.comm import transport


def job(hosts, mpi=True, device="cpu", cores=8):
    """A job whose ranks run on `hosts`, each machine with `cores` physical cores."""
    return SimpleNamespace(device=device, backend="gloo" if device == "cpu" else "nccl",
                           hostnames=tuple(hosts), launch=SimpleNamespace(mpi=mpi),
                           machine_load=lambda: [(h, hosts.count(h), cores)
                                                 for h in dict.fromkeys(hosts)])


@pytest.fixture
def mpi_up(monkeypatch):
    monkeypatch.setattr(transport, "mpi_ready", lambda: True)


@pytest.mark.parametrize("hosts, picked", [
    (["a", "a"], "mpi"),  # shared memory
    (["a", "b"], "gloo"),  # between machines: gloo's ring and its own threads
    (["a", "a", "b", "b"], "gloo"),
])
def test_auto_picks_by_where_the_bytes_go(mpi_up, hosts, picked):
    ctx = job(hosts)
    chosen = transport.choose_transport("auto", ctx)
    assert chosen == picked
    why = transport.transport_reason("auto", chosen, ctx)
    assert why == ("--cpu-transport auto under an MPI launcher" if picked == "mpi" else
                   "--cpu-transport auto between machines")


@pytest.mark.parametrize("choice", ["mpi", "gloo"])
def test_an_explicit_choice_is_kept_between_machines(mpi_up, choice):
    ctx = job(["a", "b"])
    assert transport.choose_transport(choice, ctx) == choice
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
    assert transport.choose_transport("auto", ctx) == "nccl"
    assert transport.transport_reason("auto", "nccl", ctx) == "GPU tensors"


SMALL, EAGER = transport.SMALL_MESSAGE_BYTES, transport.EAGER_BYTES


@pytest.mark.parametrize("hosts, cores, collective, point_to_point", [
    (["a", "b"], 8, SMALL, SMALL),  # a core per rank: MPI answers sooner
    (["a", "a", "b", "b"], 2, SMALL, SMALL),
    # more ranks than cores: polling ranks collide, only eager sends stay on MPI
    (["a", "a", "a", "b", "b", "b"], 2, None, EAGER),
    (["a", "a"], 8, None, None),  # one machine: every size is on MPI already
])
def test_small_messages_between_machines_go_over_mpi(mpi_up, hosts, cores, collective,
                                                     point_to_point):
    ctx = job(hosts, cores=cores)
    large = transport.choose_transport("auto", ctx)
    for kind, below in ((False, collective), (True, point_to_point)):
        small = transport.small_messages("auto", ctx, point_to_point=kind)
        assert small == (transport.SmallMessages("mpi", below) if below else None)
        limit = below or SMALL
        assert transport.transport_for(limit - 1, large, small) == ("mpi" if below else large)
        assert transport.transport_for(limit, large, small) == large
        assert transport.small_message_facts(small) == {
            "small_message_transport": "mpi" if below else None, "small_message_bytes": below}


@pytest.mark.parametrize("choice, mpi, device", [("gloo", True, "cpu"), ("mpi", True, "cpu"),
                                                 ("auto", False, "cpu"), ("auto", True, "cuda")])
def test_no_size_rule_where_auto_did_not_pick_or_mpi_cannot_carry(monkeypatch, choice, mpi,
                                                                  device):
    monkeypatch.setattr(transport, "mpi_ready", lambda: mpi)
    for point_to_point in (False, True):
        assert transport.small_messages(choice, job(["a", "b"], mpi=mpi, device=device),
                                        point_to_point) is None
