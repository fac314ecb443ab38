"""A machine lost in the middle of a job ends it: with its link down, with everything on
it killed, or with its link stalled, mpirun (and horovodrun and bfrun, through it) exits non-zero
within --timeout + 30 s and names the machine, and the emulated cluster comes down
cleanly (docs/cluster.md, "When a machine is lost").

What makes it so: PRRTE's keepalive set by `commbench setup-mpirun`, the mpirun front's
exit status and signal handling, a rank that leaves mpirun time to notice a lost
machine (commbench.launch.lost_machine.launcher_first), and the cluster's ssh, which
stays on the host like ssh does. The cluster tests need root (or CAP_NET_ADMIN) and skip
elsewhere, saying why, as tests/test_cluster.py does.
"""

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from commbench.cluster import host, namespaces, shaping, state
from commbench.errors import UsageError
from commbench.launch.lost_machine import (FORCE_AFTER, LOST_MACHINE_SECONDS, PRRTE_KEEPALIVE,
                                           launcher_first)
from commbench.launch.mpirun_front.install import install, is_front
from commbench.launch.mpirun_front.keepalive import PRRTE_DEFAULTS, set_keepalive
from launchers import BIN, kill_tree, launcher_env
from test_cluster import privileged_or_skip

TIMEOUT = 10  # the job's --timeout
BOUND = TIMEOUT + 30  # seconds from the fault to the launcher's exit
JOB = ["python", "-m", "commbench", "--model", "resnet18", "--image-size", "32",
       "--batch-size", "8", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
       "--num-iters", "2000", "--reference-iters", "1", "--reference-seconds", "0",
       "--timeout", str(TIMEOUT)]


# --- the pieces, without a cluster ---------------------------------------------------

def test_a_rank_without_answer_leaves_mpirun_time_only_across_machines():
    spread = {"OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    pause = LOST_MACHINE_SECONDS + 5
    assert launcher_first(TimeoutError("no answer"), spread) == pause
    gloo = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms")
    assert launcher_first(gloo, spread) == pause
    assert launcher_first(RuntimeError("Application timeout caused pair closure"), spread) == pause
    assert launcher_first(RuntimeError("Connection closed by peer"), spread) == 0  # a dead rank
    assert launcher_first(TimeoutError(), {"OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                                           "OMPI_COMM_WORLD_SIZE": "2"}) == 0  # one machine
    assert launcher_first(TimeoutError(), {"RANK": "0", "WORLD_SIZE": "2"}) == 0  # not mpirun
    assert LOST_MACHINE_SECONDS == dict(PRRTE_KEEPALIVE)["oob_tcp_keepalive_time"] + \
        dict(PRRTE_KEEPALIVE)["oob_tcp_keepalive_intvl"] * \
        dict(PRRTE_KEEPALIVE)["oob_tcp_keepalive_probes"]


def test_setup_writes_the_keepalive_once_keeps_the_users_own_and_takes_it_out(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    conf = tmp_path / "etc" / "prte-mca-params.conf"
    conf.write_text("# PRTE MCA parameters\noob_tcp_keepalive_probes = 7\n")
    assert (tmp_path / "bin" / PRRTE_DEFAULTS).resolve() == conf
    said = set_keepalive(tmp_path / "bin")
    assert said and "oob_tcp_keepalive_time = 5" in said[0]
    text = conf.read_text()
    assert "oob_tcp_keepalive_time = 5\noob_tcp_keepalive_intvl = 3\n" in text
    assert text.count("oob_tcp_keepalive_probes") == 1  # the file's own 7 stays
    assert "already set" in set_keepalive(tmp_path / "bin")[0] and conf.read_text() == text
    assert set_keepalive(tmp_path / "bin", remove_it=True)
    assert conf.read_text() == "# PRTE MCA parameters\noob_tcp_keepalive_probes = 7\n"
    assert set_keepalive(tmp_path / "nothing" / "bin") == []


NODE_DIED = """--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-vm-1@0,0] on node vm
  Remote daemon: [prterun-vm-1@0,2] on node cb-m7

This is usually due to either a failure of the TCP network
--------------------------------------------------------------------------"""


def fake_real_mpirun(tmp_path: Path) -> Path:
    """An Open MPI 5 mpirun stand-in behind the installed front: `lost` reports a lost
    daemon and exits 0 as PRRTE 3.0 does, `exit N` exits N, `killed` dies of SIGKILL,
    `stuck` ends only on its third SIGTERM, as PRRTE waiting for a lost daemon."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("mpirun", "mpiexec"):
        (bin_dir / name).write_text(f"""#!/bin/sh
case "$1" in
  --version) echo 'mpirun (Open MPI) 5.0.11' ;;
  lost) echo out; printf '%s\\n' '{NODE_DIED}' >&2 ;;
  exit) echo "said on stderr" >&2; exit "$2" ;;
  killed) kill -9 $$ ;;
  stuck) n=0; trap 'n=$((n+1)); [ $n -ge 3 ] && exit 1' TERM; echo ready
         while :; do sleep 0.1; done ;;
esac
""")
        (bin_dir / name).chmod(0o755)
    install(bin_dir)
    return bin_dir / "mpirun"


@pytest.mark.mpi  # runs programs named mpirun (fakes)
@pytest.mark.timeout(120)
def test_the_front_fails_a_job_whose_daemon_was_lost_and_names_the_machine(tmp_path):
    mpirun = fake_real_mpirun(tmp_path)
    done = subprocess.run([str(mpirun), "lost"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == "out\n"
    assert done.stderr.startswith(NODE_DIED)  # passed on as written
    assert done.stderr.splitlines()[-1].startswith("mpirun: error: machine cb-m7 was lost ")
    for code in (0, 3):
        done = subprocess.run([str(mpirun), "exit", str(code)], capture_output=True,
                              text=True, timeout=60)
        assert (done.returncode, done.stderr) == (code, "said on stderr\n")
    assert subprocess.run([str(mpirun), "killed"], timeout=60).returncode == -signal.SIGKILL


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_one_sigterm_ends_an_mpirun_that_waits_for_a_lost_daemon(tmp_path):
    mpirun = fake_real_mpirun(tmp_path)
    proc = subprocess.Popen([str(mpirun), "stuck"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    start = time.monotonic()
    proc.terminate()
    _, err = proc.communicate(timeout=FORCE_AFTER + 20)
    assert proc.returncode == 1 and time.monotonic() - start < FORCE_AFTER + 10
    assert "ending it as a third Ctrl-C would" in err


# --- on an emulated cluster ----------------------------------------------------------

def lost_machine_detection_or_fail():
    conf = (BIN / PRRTE_DEFAULTS).resolve()
    if not is_front(BIN / "mpirun") or "oob_tcp_keepalive_time" not in (
            conf.read_text() if conf.exists() else ""):
        pytest.fail(f"{BIN / 'mpirun'} lacks commbench's front or {conf} its keepalive: "
                    "run `commbench setup-mpirun` (docs/install.md)")


@pytest.fixture
def cluster():
    """A 2x1 cluster of this test alone, removed at the end whatever happened."""
    privileged_or_skip()
    lost_machine_detection_or_fail()
    name = f"lm{os.getpid() % 1000000}"
    try:
        made = namespaces.up(name, machines=2, slots=1, link="1gbit")
    except UsageError as e:  # no network namespaces here (a container without them)
        namespaces.down(name)
        if os.environ.get("CI"):
            pytest.fail(f"CI must test emulated clusters: {e}")
        pytest.skip(str(e))
    try:
        yield made
    finally:
        namespaces.down(name)


def link_down(c):
    subprocess.run(["ip", "link", "set", c.netns(1), "down"], check=True)


def everything_killed(c):
    pids = subprocess.run(["ip", "netns", "pids", c.netns(1)], capture_output=True, text=True,
                          check=True).stdout.split()
    assert pids, "nothing of the job runs on the machine"
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def link_stalled(c):
    for where in (["-n", c.netns(1), "qdisc", "change", "dev", c.nic],  # its sending
                  ["qdisc", "change", "dev", c.netns(1)]):  # and receiving end
        subprocess.run(["tc", *where, "root", "tbf", *shaping.tbf("1kbit")], check=True)


def lose_a_machine(c, launch, strategy, fault, tmp_path, bin_dir=BIN):
    """Start the job, lose machine 1 once it trains, and wait for the launcher: its exit
    status, its output after the fault, and the seconds from the fault to its exit.
    bin_dir: the environment whose launchers and python run the job."""
    env = launcher_env({"PATH": f"{c.bin}:{bin_dir}:{os.environ['PATH']}"})
    proc = subprocess.Popen([*launch, *JOB, f"--dist-optimizer={strategy}", "--results-dir",
                             str(tmp_path)], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines, training = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "Iter #" in line:
                training.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert training.wait(120), "the job never started training:\n" + "".join(lines[-40:])
        seen = len(lines)
        fault(c)
        start = time.monotonic()
        try:
            proc.wait(timeout=BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{launch[0]} still running {BOUND} s after the fault:\n"
                        + "".join(lines[seen:])[-3000:])
        took = time.monotonic() - start
        reader.join(10)
        return proc.returncode, "".join(lines[seen:]), took
    finally:
        kill_tree(proc.pid)


def assert_ended_and_torn_down(c, code, after, took, tmp_path):
    assert code != 0, after[-3000:]
    assert took < BOUND
    lost = c.machine(1)
    assert re.search(rf"machine {lost} was lost|Remote host: +{lost}\b", after), after[-3000:]
    assert not list(tmp_path.glob("*.json"))  # nothing written as measured
    # the launcher ended the job on the machine that still answers too
    deadline = time.monotonic() + 15
    while subprocess.run(["ip", "netns", "pids", c.netns(0)], capture_output=True,
                         text=True).stdout.split():
        assert time.monotonic() < deadline, "ranks or daemons outlived the job on machine 0"
        time.sleep(0.5)
    removed = namespaces.down(c.name)
    assert f"namespace {c.netns(1)}" in removed
    assert state.load(c.name) is None
    assert not {n for n in host.existing_netns() | host.existing_links()
                if n.split("@")[0].startswith(f"{c.name}-")}


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", [link_down, everything_killed, link_stalled])
def test_mpirun_ends_when_a_machine_is_lost(cluster, tmp_path, fault):
    launch = ["mpirun", "-H", cluster.hosts, "-np", "2", "--bind-to", "none"]
    code, after, took = lose_a_machine(cluster, launch, "allreduce", fault, tmp_path)
    assert_ended_and_torn_down(cluster, code, after, took, tmp_path)


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", [link_down, everything_killed, link_stalled])
def test_horovodrun_ends_when_a_machine_is_lost(cluster, tmp_path, fault):
    from test_horovod import horovod_or_skip

    horovod_or_skip()
    launch = ["horovodrun", "-np", "2", "-H", cluster.hosts]
    code, after, took = lose_a_machine(cluster, launch, "horovod", fault, tmp_path)
    assert_ended_and_torn_down(cluster, code, after, took, tmp_path)


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_bfrun_ends_when_a_machines_link_goes_down(cluster, tmp_path):
    from test_bluefog import bluefog_python

    launch = ["bfrun", "-np", "2", "-H", cluster.hosts]
    code, after, took = lose_a_machine(cluster, launch, "bluefog.neighbor_allreduce", link_down,
                                       tmp_path, bin_dir=Path(bluefog_python()).parent)
    assert_ended_and_torn_down(cluster, code, after, took, tmp_path)
