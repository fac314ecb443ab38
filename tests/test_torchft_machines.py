"""`commbench torchft --cluster NAME` (commbench.faults.torchft_machines): replica group g
started on an emulated cluster's machine g, given that machine's address alone, the
lighthouse on machine 0; a cluster that cannot hold the run refused in one line;
nothing left running on the machines however the command ends; and, end to end, a
killed group healing from its peer across the emulated link.

The tests that make a cluster need root (or CAP_NET_ADMIN), as tests/test_cluster.py's."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pytest

from cli_helpers import commbench, refused
from commbench.cluster import namespaces, state
from commbench.cluster.state import Cluster
from commbench.faults import torchft_group, torchft_launch, torchft_machines
from launchers import PYTHON, kill_tree, only_result, run
from test_cluster import privileged_or_skip
from test_torchft import TINY, connects, lighthouse_of_one, needs_torchft
from test_training_to_accuracy import TINY_TASK

CLUSTER = Cluster("tq", machines=3, slots=1, link="100mbit", subnet="10.213.250.0/24")


@pytest.fixture
def cluster_name():
    """A cluster name of this test alone, its cluster removed at the end whatever
    happened."""
    privileged_or_skip()
    made = f"f{os.getpid() % 100000}"
    yield made
    namespaces.down(made)


def pids_in(cluster):
    """The processes running on each of the cluster's machines."""
    return [subprocess.run(["ip", "netns", "pids", cluster.netns(i)], capture_output=True,
                           text=True).stdout.split() for i in range(cluster.machines)]


def test_a_group_on_a_cluster_starts_on_its_machine_told_that_machines_address_alone(
        tmp_path):
    flags = torchft_launch.replica_flags(TINY)
    place = torchft_machines.Placement(CLUSTER)
    groups = torchft_launch.Groups(flags, 2, "http://10.213.250.1:7", str(tmp_path), (), 30.0,
                                   place)
    argv, env = groups.command(1)
    assert argv == ["nsenter", f"--uts={CLUSTER.uts(1)}", "--", "ip", "netns", "exec",
                    "tq-m1", sys.executable, "-m", "commbench", *flags]
    # its store, its Manager and the state peers heal from: all at its machine's address
    assert env["MASTER_ADDR"] == CLUSTER.address(1) == "10.213.250.2"
    assert env["TORCHFT_LIGHTHOUSE"] == "http://10.213.250.1:7"
    assert env[torchft_group.GROUP] == "1" and env["GLOO_SOCKET_IFNAME"] == CLUSTER.nic
    network = json.loads(env["COMMBENCH_EMULATED_NETWORK"])  # what its result records
    assert (network["cluster"], network["link"], network["machines"]) == ("tq", "100mbit", 3)
    # without a cluster: this host, on its loopback, as before
    argv, env = torchft_launch.Groups(flags, 2, "http://h:1", str(tmp_path), (), 30.0) \
        .command(1)
    assert argv[:3] == [sys.executable, "-m", "commbench"] and env["MASTER_ADDR"] == "127.0.0.1"


@needs_torchft
def test_every_address_a_groups_manager_gives_its_peers_is_its_machines(tmp_path,
                                                                        monkeypatch):
    """MASTER_ADDR, not this host's name: the store, the Manager's server, and where a
    healing peer fetches the state (torchft's HTTP transport names the host itself)."""
    from types import SimpleNamespace

    import torch

    from commbench.config.run_config import RunConfig

    here = "127.0.0.2"  # on the loopback, as a machine's address is on its NIC
    with lighthouse_of_one(monkeypatch, tmp_path, torchft_launch.free_port(), here):
        replica = torchft_group.Replica(RunConfig(timeout=30.0),
                                        SimpleNamespace(rank=0, world_size=1), print, 8,
                                        SimpleNamespace(name="allreduce"))
        model = torch.nn.Linear(4, 3)
        replica.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
        try:
            manager = replica.manager
            assert manager._checkpoint_transport.metadata().startswith(f"http://{here}:")
            assert manager._manager.address().startswith(f"http://{here}:")
            assert manager._store.host == here
        finally:
            replica.manager.shutdown(wait=True)


@pytest.mark.parametrize("address, loopback", [
    ("http://localhost:29510", True), ("http://127.0.0.1:1", True), ("[::1]:5", True),
    ("http://10.213.0.254:29510", False), ("lighthouse.example:29510", False)])
def test_a_lighthouse_on_the_hosts_loopback_is_told_apart(address, loopback):
    assert torchft_machines.on_loopback(address) is loopback


@pytest.mark.parametrize("cluster, args, message", [
    (None, ["--cluster", "tnone"], "argument --cluster: no emulated cluster tnone is up "
     "(commbench cluster up --name tnone --machines 2)"),
    (Cluster("tone", 1, 1, "1gbit", "10.213.251.0/24"), ["--cluster", "tone"], "argument "
     "--cluster: cluster tone has 1 machine(s), fewer than the 2 replica groups (one on each)"),
    (Cluster("tlh", 2, 1, "1gbit", "10.213.252.0/24"), ["--cluster", "tlh", "--lighthouse",
                                                        "http://localhost:29510"],
     "argument --lighthouse: http://localhost:29510 is on this host's loopback, which the "
     "machines of cluster tlh cannot reach: give its address on the cluster's bridge, "
     "10.213.252.254"),
    (Cluster("tgone", 2, 1, "1gbit", "10.213.253.0/24"), ["--cluster", "tgone"], "argument "
     "--cluster: cluster tgone is down (bridge tgone-br is missing): commbench cluster down "
     "--name tgone, then up again"),
])
def test_a_cluster_that_cannot_hold_the_run_is_refused_in_one_line(
        cluster, args, message, tmp_path, monkeypatch):
    # A record of a cluster whose namespaces were never made (or lost): its state alone.
    monkeypatch.setattr(state, "STATE_ROOT", tmp_path)
    if cluster is not None:
        cluster.directory.mkdir()
        cluster.directory.joinpath("state.json").write_text(json.dumps(asdict(cluster)))
    # who runs the tests may not enter namespaces: that refusal has a test of its own
    monkeypatch.setattr(torchft_machines, "check_privileges", lambda: None)
    monkeypatch.setattr(torchft_launch.Groups, "start", None)
    assert refused("torchft", "-n", "2", *args, "--", *TINY) == f"commbench: error: {message}"


@pytest.mark.job
def test_without_privileges_the_cluster_is_refused_in_one_line():
    privileged_or_skip()
    done = subprocess.run(["setpriv", "--bounding-set", "-net_admin", "--inh-caps",
                           "-net_admin", PYTHON, "-m", "commbench", "torchft", "-n", "2",
                           "--cluster", "tnop", "--", *TINY], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "needs root (or CAP_NET_ADMIN)" in done.stderr


@needs_torchft
@pytest.mark.job
@pytest.mark.timeout(300)
def test_the_lighthouse_runs_on_machine_0_and_nothing_outlives_a_terminated_run(
        cluster_name, tmp_path):
    cluster = namespaces.up(cluster_name, machines=2, slots=1, link="1gbit")
    with torchft_launch.lighthouse(None, cluster) as address:
        assert address.startswith(f"http://{cluster.address(0)}:") and connects(address)
        assert pids_in(cluster)[0] and not pids_in(cluster)[1]
    assert pids_in(cluster) == [[], []] and not connects(address)
    proc = subprocess.Popen([PYTHON, "-m", "commbench", "torchft", "-n", "2", "--cluster",
                             cluster_name, "--", *TINY, "--results-dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all(pids_in(cluster)):  # a group on each machine
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the groups never started on their machines"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        kill_tree(proc.pid)
    assert pids_in(cluster) == [[], []], "a group or the lighthouse outlived the command"


@needs_torchft
@pytest.mark.mpi
@pytest.mark.timeout(420)
def test_a_killed_group_heals_from_its_peer_across_the_emulated_link(cluster_name, tmp_path):
    """Two replica groups on two machines linked at 500mbit; group 1 killed at its 5th
    step and started again on its machine 1 s later heals from group 0 (torchft's HTTP
    transport, at machine 0's address) and both reach the planned end alike."""
    cluster = namespaces.up(cluster_name, machines=2, slots=1, link="500mbit")
    before = namespaces.sent_bytes(cluster)
    done = run([PYTHON, "-m", "commbench", "torchft", "-n", "2", "--cluster", cluster_name,
                "--", *TINY_TASK, "--max-epochs", "12", "--eval-every", "100", "--timeout",
                "30", "--fail", "1@step5+1s", "--results-dir", str(tmp_path)], timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    sent = namespaces.sent_bytes(cluster) - before
    doc = only_result(tmp_path)
    [cost] = doc["recovery"]["costs"]
    assert cost["event"] == "1@step5:kill+1s" and cost["rejoin_seconds"] is not None
    digest = doc["recovery"]["final_parameters_sha256"]
    assert (f"commbench torchft: the 2 replica groups ended at step 60 with the same "
            f"parameters (sha256 {digest[:16]})") in done.stdout
    # the healing fetch came from machine 1 to group 0's state server, which listens
    # on machine 0 alone (torchft's server logs each request)
    assert re.search(rf"::ffff:{re.escape(cluster.address(1))} .* \"GET /checkpoint/[1-9]",
                     done.stderr), done.stderr[-3000:]
    # the result says where it ran, as a run of mpirun on the cluster does
    network = doc["environment"]["emulated_network"]
    assert (network["cluster"], network["link"]) == (cluster_name, "500mbit")
    assert doc["environment"]["hostnames"] == [cluster.machine(0)]
    assert "emulated, 500mbit links network" in commbench("report", tmp_path).stdout
    # resnet18's 45 MB of gradients crossed the links at every step the groups shared
    assert sent > 5 * 2 * 40e6, sent
    assert pids_in(cluster) == [[], []]
