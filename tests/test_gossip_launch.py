"""`commbench gossip -- mpiexec ...` (commbench.faults.gossip_launch): what it refuses in
one line, the line it runs and the rank it starts again; and through mpiexec, four ranks
of neighbor_allreduce trained to accuracy, rank 2 killed by --fail and started again 5 s
later, admitted by the others, back to the run's planned end with all four; and on an
emulated cluster, the rank started again on its own machine."""

import pytest

from cli_helpers import commbench, refused
from commbench.cluster import state
from commbench.errors import UsageError
from commbench.faults import gossip_launch
from commbench.faults.torchft_machines import Placement
from commbench.faults.recovery import GOSSIP_SUPERVISED
from commbench.launch.detect import LaunchInfo, detect_launch
from launchers import PYTHON, mpiexec_path, only_result, run
from test_cluster import privileged_or_skip
from test_gossip_recovery import GOSSIP, MPIEXEC
from test_torchft_machines import CLUSTER
from test_training_to_accuracy import TINY_TASK

PROGRAM = ["python", "-m", "commbench", *TINY_TASK, *GOSSIP, "--max-epochs", "8",
           "--eval-every", "4", "--fail", "2@step8:kill+5s"]


def test_the_launcher_passes_the_store_on_and_keeps_the_others_running():
    line = ["mpiexec", "-n", "4", *PROGRAM]
    assert gossip_launch.wrapped(line) == [
        "mpiexec", "--enable-recovery", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x",
        GOSSIP_SUPERVISED, "-n", "4", *PROGRAM]
    kept = ["mpirun", "--with-ft", "ulfm", "-n", "4", *PROGRAM]
    assert gossip_launch.wrapped(kept)[:2] == ["mpirun", "-x"]
    assert gossip_launch.program_flags(line) == PROGRAM[3:]


def test_a_rank_started_again_is_told_its_rank_and_the_world():
    argv, env = gossip_launch.rejoiner(["--recovery", "gossip"], {"MASTER_PORT": "9"}, 2, 4)
    assert argv[1:] == ["-m", "commbench", "--recovery", "gossip"]
    assert detect_launch(env) == LaunchInfo("gossip-rejoin", 2, 4)
    assert env["MASTER_PORT"] == "9"


def test_on_a_cluster_a_rank_is_started_again_on_its_own_machine():
    place = Placement(CLUSTER)
    machine = gossip_launch.machine_of(place, CLUSTER.machine(1))
    argv, env = gossip_launch.rejoiner(["--recovery", "gossip"], {}, 1, 3, place, machine)
    assert argv[:7] == CLUSTER.enter(1) and argv[7:] == [PYTHON, "-m", "commbench",
                                                        "--recovery", "gossip"]
    assert env["GLOO_SOCKET_IFNAME"] == CLUSTER.nic and "COMMBENCH_EMULATED_NETWORK" in env
    assert gossip_launch.machine_of(Placement(), "vm") == 0
    line = ["mpirun", "-H", "tq-m0:1,tq-m1:1", *PROGRAM]
    assert gossip_launch.program_flags(line, elsewhere=True) == PROGRAM[3:]
    assert [gossip_launch.machines(li) for li in (line, PROGRAM)] == [2, 1]


@pytest.mark.parametrize("served", [False, True])
def test_once_rank_0_and_its_store_are_gone_nothing_more_is_polled_or_started(served):
    """The job's end races the watch: rank 0, which serves the store, may end before
    mpiexec does; the launcher's exit status is then mpiexec's, not the store's error.
    A store that still accepts connections only answered late: the watch goes on."""
    import socket

    import torch.distributed as dist

    class Failing:
        asked = 0

        def check(self, keys):
            Failing.asked += 1
            raise getattr(dist, "DistNetworkError", RuntimeError)("Connection reset by peer")

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        if served:
            listener.listen()
        port = listener.getsockname()[1]
        rejoins = gossip_launch.Rejoins([], "2@step8+5s", {"MASTER_ADDR": "127.0.0.1"}, port)
        rejoins.store, rejoins.events = Failing(), {2: object()}
        rejoins.poll()
        rejoins.poll()
    assert rejoins.gone is not served and not rejoins.procs
    assert Failing.asked == (2 if served else 1)


@pytest.mark.parametrize("line, message", [
    ([], "gossip: no command to run; give it after --"),
    (["torchrun", "--nproc-per-node", "4", *PROGRAM], "gossip: torchrun is not Open MPI's "
     "mpiexec or mpirun; commbench gossip runs a job under it"),
    (["mpiexec", "-n", "4", "python", "train.py"], "gossip: no `python -m commbench` in the "
     "launcher's line"),
    (["mpiexec", "-H", "a,b", *PROGRAM], "gossip: -H runs ranks on other machines, but a "
     "rank that rejoins is started again on this one; run on this host, or on an emulated "
     "cluster with --cluster NAME"),
    (["mpiexec", "-n", "4", "python", "-m", "commbench", *TINY_TASK], "argument --recovery: "
     "commbench gossip runs --recovery gossip, not none"),
])
def test_commbench_gossip_refuses_a_line_it_could_not_start_a_rank_of_again(line, message):
    assert refused("gossip", "--", *line).startswith("commbench: error: " + message)


def test_a_cluster_short_of_the_lines_machines_is_refused_in_its_own_words(
        tmp_path, monkeypatch):
    import json
    from dataclasses import asdict

    from commbench.cluster.state import Cluster
    from commbench.faults import torchft_machines

    monkeypatch.setattr(state, "STATE_ROOT", tmp_path)
    small = Cluster("tgs", 1, 1, "1gbit", "10.213.250.0/24")
    small.directory.mkdir()
    small.directory.joinpath("state.json").write_text(json.dumps(asdict(small)))
    monkeypatch.setattr(torchft_machines, "check_privileges", lambda: None)
    line = ["mpirun", "-H", "tgs-m0:1,tgs-m1:1", *PROGRAM]
    assert refused("gossip", "--cluster", "tgs", "--", *line) == (
        "commbench: error: argument --cluster: cluster tgs has 1 machine(s), fewer than "
        "the 2 machines of the line's -H list")


def test_a_rejoin_is_refused_under_a_bare_mpiexec_and_accepted_under_commbench_gossip(
        tmp_path):
    args = ["run", *TINY_TASK, *GOSSIP, "--max-epochs", "8", "--eval-every", "4",
            "--results-dir", tmp_path]
    bare = commbench(*args, "--fail", "2@step8+5s", env=MPIEXEC)
    assert bare.returncode == 2 and bare.stderr.strip() == (
        "commbench: error: argument --fail: 2@step8:kill+5s rejoins, but nothing starts "
        "rank 2 again: run the job under `commbench gossip -- mpiexec ...`")
    twice = commbench(*args, "--fail", "2@step8+5s,2@step12", env={
        **MPIEXEC, GOSSIP_SUPERVISED: "1"})
    assert twice.returncode == 2 and twice.stderr.strip() == (
        "commbench: error: argument --fail: rank 2 fails twice; after its first failure it "
        "is gone for good")


@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["kill", "stop"])
def test_a_killed_rank_started_again_is_admitted_and_the_run_ends_with_all_four(
        tmp_path, kind):
    """60 steps (30 epochs of 2), rank 2 killed (or stopped, then killed once found lost)
    as its 8th step begins and started again 5 s later: admitted at the next admission
    point it asked before, it takes the survivors' mean and the run ends with all four."""
    line = [mpiexec_path(), "-n", "4", "--oversubscribe", "--bind-to", "none",
            "--enable-recovery", PYTHON, "-m", "commbench", *TINY_TASK, "--max-epochs", "30",
            "--eval-every", "4", *GOSSIP, "--fail", f"2@step8:{kind}+5s", "--timeout", "10",
            "--results-dir", str(tmp_path)]
    done = run([PYTHON, "-m", "commbench", "gossip", "--", *line], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"commbench gossip: rank 2 was lost (2@step8:{kind}+5s); starting it again in" \
        in done.stderr
    doc = only_result(tmp_path)
    summary, recovery = doc["summary"], doc["recovery"]
    assert (summary["steps"], summary["stopped_by"]) == (60, "max epochs")
    assert (recovery["survivors"], recovery["rejoined"]) == ([0, 1, 2, 3], [2])
    assert recovery["fewest_workers"] == 3
    (cost,) = recovery["costs"]
    assert (cost["rank"], cost["failed_after_step"]) == (2, 7)
    assert 5 < cost["asked_after_seconds"] < cost["rejoin_seconds"] < 60
    fewer = cost["steps_with_fewer_workers"]
    assert fewer == cost["rejoined_at_step"] - 7 and 1 <= fewer <= 52
    assert cost["rejoined_at_step"] % 5 == 0
    curve = doc["curve"]
    assert curve[-1]["samples"] == 7680 - fewer * 32
    before = [p for p in curve if p["step"] <= 7][-1]["consensus_distance"]
    assert curve[-1]["consensus_distance"] < before


def test_a_rank_started_again_builds_its_context_from_the_jobs_record(monkeypatch):
    import dataclasses
    import datetime

    import torch.distributed as dist

    from commbench.config.run_config import add_run_arguments, config_from_args
    from commbench.config.flags import OneLineParser
    from commbench.faults import gossip_rejoin
    from commbench.faults.gossip_survival import PREFIX

    parser = OneLineParser()
    add_run_arguments(parser)
    config = config_from_args(parser.parse_args(PROGRAM[3:]))
    server = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=5),
                           wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # this process's threads left alone
    started = type("Ctx", (), dict(
        world_size=4, machine_size=2, simulated_machines=True, hostnames=("a", "a", "b", "b"),
        cores=(8, 8, 8, 8), physical_hosts=("h",) * 4, machine_facts=({},) * 4))
    # as the members recorded it: --amp resolved as the job starts
    server.set(f"{PREFIX}/job", gossip_rejoin.record(started, dataclasses.replace(
        config, amp="off")))
    ctx = gossip_rejoin.context(LaunchInfo("gossip-rejoin", 2, 4), config)
    assert (ctx.rank, ctx.world_size, ctx.launch.local_rank, ctx.launch.node_rank) == (2, 4, 0, 1)
    assert (ctx.hostnames, ctx.machine_size, ctx.backend) == (("a", "a", "b", "b"), 2, "gloo")
    assert gossip_rejoin.JOINING["store"] is not None
    other = config_from_args(parser.parse_args([*PROGRAM[3:], "--seed", "7"]))
    with pytest.raises(UsageError) as refused_flags:
        gossip_rejoin.context(LaunchInfo("gossip-rejoin", 2, 4), other)
    assert str(refused_flags.value) == ("rank 2 was started again with flags or a world size "
                                        "other than the job's")


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_on_an_emulated_cluster_a_killed_rank_rejoins_from_its_own_machine(tmp_path):
    """A sweep on 3 emulated machines, whose rank 2 killed at its 8th step rejoins 3 s
    later through `commbench gossip --cluster`, started on machine 2: the run ends with
    all three and the cluster is removed."""
    privileged_or_skip()
    done = run([PYTHON, "-m", "commbench", "sweep", "--emulate", "3x1", "--link", "1gbit",
                *TINY_TASK, *GOSSIP, "--max-epochs", "20", "--eval-every", "4",
                "--fail", "2@step8:kill+3s", "--timeout", "10",
                "--results-dir", str(tmp_path / "results"), "--plots-dir",
                str(tmp_path / "charts")], timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    name = next(line.split()[2].rstrip(":") for line in done.stdout.splitlines()
                if line.startswith("Emulated cluster "))
    assert f"gossip --cluster {name} -- " in done.stdout and state.load(name) is None
    doc = only_result(tmp_path / "results")
    assert (doc["recovery"]["survivors"], doc["recovery"]["rejoined"]) == ([0, 1, 2], [2])
    assert doc["environment"]["emulated_network"]["link"] == "1gbit"
