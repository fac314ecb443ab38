"""`--fail RANK@WHEN:cut` (commbench.faults.fail_inject.cut_link): a rank takes its
emulated machine's link down. Refused in one line where there is no such link or the
policy could not outlive it; on an emulated cluster (root), mpirun ends the job naming
the machine, `commbench supervise` waits for the machine to be back before the
restarted job resumes from its checkpoint, and torchft's quorum goes on without a cut
replica group, which heals from its peer once its link is back."""

import os
import re
import subprocess
import time

import pytest

from cli_helpers import commbench
from commbench.config.run_config import RunConfig
from commbench.errors import UsageError
from commbench.faults import fail_inject, fail_schedule, recovery
from launchers import BIN, PYTHON, only_result, run
from test_lost_machine import BOUND, TIMEOUT, cluster  # noqa: F401 (the fixture)
from test_recovery import RESTART, TINY, TORCHRUN
from test_torchft import needs_torchft
from test_training_to_accuracy import TINY_TASK

EMULATED = '{"cluster": "cb", "nic": "cb-br", "link": "1gbit"}'


def test_a_cut_is_a_kind_of_failure_of_events_and_random_schedules():
    (event,) = fail_schedule.parse("1@step3:cut+5s")
    assert (event.kind, event.rejoin, str(event)) == ("cut", 5.0, "1@step3:cut+5s")
    assert fail_schedule.parse("mtbf=60s,seed=1,kind=cut").kind == "cut"
    assert fail_inject.describe("1@step3:cut", 2) == \
        "rank 1 cut off (its machine's link) at step 3"
    assert fail_schedule.first_of_kind("1@step3,2@step4:cut", "cut").rank == 2
    assert fail_schedule.first_of_kind("1@step3:stop", "cut") is None


def test_a_cut_takes_the_link_down_instead_of_a_signal():
    done = []
    injector = fail_inject.Injector(fail_schedule.schedule("0@step2:cut", 1), 0,
                                    "0@step2:cut", 10.0, die=lambda sig: done.append(sig),
                                    cut=lambda event: done.append(str(event)))
    for _ in range(3):
        injector.before_step()
    assert done == ["0@step2:cut"]
    (event,) = fail_schedule.parse("0@step2:cut")
    assert "takes its machine's link down" in injector.what(event)
    assert "the job ends when mpirun loses its daemon there" in injector.what(event)
    injector.survived = True  # gossip's and torchft's: the others go on
    assert "the others go on without it once they find it lost" in injector.what(event)


@pytest.mark.parametrize("policy, env, message", [
    ("none", {}, "argument --fail: 1@step3:cut takes the rank's machine off the network, "
     "which commbench does only on an emulated cluster's machines"),
    ("gossip", {"COMMBENCH_EMULATED_NETWORK": EMULATED}, "argument --fail: 1@step3:cut "
     "under --recovery gossip: Open MPI ends the job when it loses the cut machine's "
     "daemon"),
    ("torchft", {}, "argument --fail: 1@step3:cut takes the rank's machine off the network, "
     "which commbench does only on an emulated cluster's machines"),
    ("none", {"COMMBENCH_EMULATED_NETWORK": EMULATED, "uid": 1000}, "argument --fail: "
     "1@step3:cut takes a network interface down, which needs root"),
    ("torchft", {"COMMBENCH_EMULATED_NETWORK": EMULATED}, "argument --fail: 1@step3:cut "
     "under --recovery torchft needs +REJOIN (rejoin= in a random schedule)"),
])
def test_a_cut_where_there_is_no_link_or_the_policy_could_not_outlive_it_is_refused(
        policy, env, message, monkeypatch):
    monkeypatch.delenv("COMMBENCH_EMULATED_NETWORK", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: env.get("uid", 0))
    for name, value in env.items():
        if name != "uid":
            monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        recovery.check_cut(RunConfig(fail="1@step3:cut", recovery=policy))
    monkeypatch.setenv("COMMBENCH_EMULATED_NETWORK", EMULATED)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    if policy != "gossip":  # on an emulated machine, as root (torchft: the link back)
        fail = "1@step3:cut+5s" if policy == "torchft" else "1@step3:cut"
        recovery.check_cut(RunConfig(fail=fail, recovery=policy))


def test_a_restart_waits_for_the_machines_its_launcher_names_and_says_when_it_gives_up(
        monkeypatch, capsys):
    from commbench.cluster import namespaces
    from commbench.faults.supervise import hosts

    assert hosts(["mpirun", "-H", "cb-m0:2,cb-m1:2", "-np", "4"]) == {"cb-m0", "cb-m1"}
    assert hosts(["mpirun", "--host=cb-m0,cb-m2", "-host", "cb-m3"]) == {"cb-m0", "cb-m2",
                                                                          "cb-m3"}
    assert hosts(["mpiexec", "-n", "4", "python"]) is None
    looks = []
    away = iter([["cb-m1"], ["cb-m1"], []])
    monkeypatch.setattr(namespaces, "cut_off", lambda machines: looks.append(machines)
                        or next(away))
    monkeypatch.setattr(namespaces, "POLL_SECONDS", 0.01)
    namespaces.wait_for_machines("commbench supervise", {"cb-m1"})
    assert looks == [{"cb-m1"}] * 3
    assert capsys.readouterr().err == ("commbench supervise: waiting for cb-m1 to be back on "
                                       "the network (cut off by --fail)\n")
    monkeypatch.setattr(namespaces, "cut_off", lambda machines: ["cb-m1"])
    namespaces.wait_for_machines("commbench sweep", None, patience=0.05)
    assert capsys.readouterr().err.endswith("commbench sweep: cb-m1 still cut off the network "
                                            "after 0 s; going on without waiting\n")


def test_cut_off_says_nothing_where_it_cannot_look(monkeypatch):
    from commbench.cluster import namespaces
    from commbench.cluster.state import Cluster
    from commbench.errors import UsageError as Refused

    def no_ip():
        raise Refused("`ip` not found")

    monkeypatch.setattr(namespaces, "existing_netns", no_ip)
    assert namespaces.cut_off() == []
    # a cluster on record whose machines are gone, or whose NIC cannot be read: nothing
    monkeypatch.setattr(namespaces, "existing_netns", lambda: {"cb-m1"})
    monkeypatch.setattr(namespaces, "clusters", lambda: [Cluster("cb", 2, 1, "1gbit",
                                                                 "10.213.9.0/24")])
    monkeypatch.setattr(namespaces, "tool", lambda *argv, check: subprocess.CompletedProcess(
        argv, 1, "", "Cannot open network namespace"))
    assert namespaces.cut_off({"cb-m1"}) == [] and namespaces.cut_off({"10.213.9.2"}) == []


def test_a_run_refuses_a_cut_off_an_emulated_cluster_in_one_line(tmp_path):
    done = commbench("run", *TINY, "--fail", "1@step3:cut", "--results-dir", tmp_path,
                     env=TORCHRUN)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("commbench: error: argument --fail: 1@step3:cut takes the "
                               "rank's machine off the network")


def nic_up(c, machine: int) -> bool:
    shown = subprocess.run(["ip", "-n", c.netns(machine), "-br", "link", "show", "dev", c.nic],
                           capture_output=True, text=True, check=True).stdout
    return " UP " in f" {shown} "


def on_cluster(c, command, timeout):
    """`command` on the host with the cluster's ssh first on PATH, as a user launches."""
    done = run(command, timeout, env={"PATH": f"{c.bin}:{BIN}:{os.environ['PATH']}"})
    return done.returncode, done.stdout, done.stderr


MPIRUN = ["mpirun", "-np", "2", "--bind-to", "none"]


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_cut_machine_ends_the_job_naming_it_and_comes_back_after(cluster, tmp_path):  # noqa: F811
    started = time.monotonic()
    code, _, err = on_cluster(cluster, [*MPIRUN, "-H", cluster.hosts, PYTHON, "-m",
                                        "commbench", *TINY, "--fail", "1@step3:cut",
                                        "--timeout", str(TIMEOUT), "--results-dir",
                                        str(tmp_path)], 240)
    assert code != 0, err[-3000:]
    assert "failure injected by --fail (1@step3:cut)" in err
    assert f"machine {cluster.machine(1)} was lost" in err, err[-3000:]
    assert time.monotonic() - started < 120 + BOUND
    assert not list(tmp_path.glob("*.json"))
    deadline = time.monotonic() + 60  # the cut rank ends after its own --timeout
    while not nic_up(cluster, 1):
        assert time.monotonic() < deadline, "the cut machine's link stayed down"
        time.sleep(0.5)


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_a_restart_waits_for_the_cut_machine_and_resumes_from_its_checkpoint(
        cluster, tmp_path):  # noqa: F811
    code, out, err = on_cluster(cluster, [
        PYTHON, "-m", "commbench", "supervise", "--restarts", "1", "--", *MPIRUN, "-H",
        cluster.hosts, PYTHON, "-m", "commbench", *TINY, *RESTART, "--fail", "1@step6:cut",
        "--timeout", str(TIMEOUT), "--results-dir", str(tmp_path)], 360)
    assert code == 0, err[-3000:]
    assert f"commbench supervise: waiting for {cluster.machine(1)} to be back on the " \
        "network (cut off by --fail)" in err
    assert "Resumed from checkpoint " in out and "(step 3)" in out
    [cost] = only_result(tmp_path)["recovery"]["costs"]
    assert cost["event"] == "1@step6:cut" and cost["resumed_from_step"] == 3
    # found lost by the peer at its --timeout; mpirun, which waits for its daemon's
    # keepalive, ends the job later
    assert TIMEOUT <= cost["detection_seconds"] < TIMEOUT + 10, cost
    assert cost["detection_seconds"] <= cost["restart_seconds"] < BOUND, cost
    assert nic_up(cluster, 1)


# Longer than the lighthouse's 5 s heartbeat timeout (commbench.faults.torchft_launch) by
# a margin a loaded box keeps: a shorter cut is only a stall, TCP resends once it is over.
CUT = "1@step5:cut+10s"


@needs_torchft
@pytest.mark.mpi
@pytest.mark.timeout(420)
def test_a_cut_replica_group_is_left_out_of_the_quorum_and_heals_once_back(
        cluster, tmp_path):  # noqa: F811
    # 30 epochs: alone, group 0 goes twice as fast; it trains on past the cut's end long
    # enough for the healed group to rejoin before the job is over.
    code, out, err = on_cluster(cluster, [
        PYTHON, "-m", "commbench", "torchft", "-n", "2", "--cluster", cluster.name, "--",
        *TINY_TASK, "--max-epochs", "30", "--eval-every", "1000", "--timeout", "30",
        "--fail", CUT, "--results-dir", str(tmp_path)], 360)
    assert code == 0, err[-3000:]
    assert f"failure injected by --fail ({CUT})" in err
    doc = only_result(tmp_path)
    [cost] = doc["recovery"]["costs"]
    assert cost["event"] == CUT and cost["steps_with_fewer_groups"] > 0, cost
    # back in the quorum once its link was: the same process, healed from group 0
    assert cost["rejoin_seconds"] is not None and 10 < cost["rejoin_seconds"] < 120, cost
    assert re.search(rf"::ffff:{re.escape(cluster.address(1))} .* \"GET /checkpoint/[1-9]",
                     err), err[-3000:]
    digest = doc["recovery"]["final_parameters_sha256"]
    assert (f"commbench torchft: the 2 replica groups ended at step 150 with the same "
            f"parameters (sha256 {digest[:16]})") in out
    assert nic_up(cluster, 1)
