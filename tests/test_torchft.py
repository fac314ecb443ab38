"""--recovery torchft (commbench.faults.torchft_launch, torchft_group, torchft_exchange,
torchft_costs): what
each failure cost, from the failing group's record and group 0's log of its quorum's
steps; allreduce, local_sgd and diloco mapped onto torchft's classes; the
replica groups' command lines and environment; the launcher's watch (a failed group
started again after its +REJOIN, a death nothing explains ends the job); the lighthouse
started and shut down, a given one that does not answer refused; what is refused in one
line, before any group starts."""

import contextlib
import copy
import importlib.util
import re
import signal
import socket
import subprocess
import time
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from analysis_helpers import run_report
from cli_helpers import commbench, refused
from commbench.errors import UsageError
from commbench.faults import torchft_costs, torchft_exchange, torchft_group, torchft_launch
from commbench.faults.fail_schedule import FailEvent
from commbench.faults.torchft_costs import StepRecord
from launchers import PYTHON, only_result, run
from test_accuracy_analysis import fixture, write_run
from test_training_to_accuracy import TINY_TASK

TINY = [*TINY_TASK, "--max-epochs", "2"]
# 5 steps an epoch for 2 groups, as TINY_TASK's
TINY_LM = ["--model", "lm-tiny", "--seq-len", "16", "--batch-size", "16", "--data",
           "language:vocab=16,order=1,samples=160", "--reference-iters", "0"]
needs_torchft = pytest.mark.skipif(
    importlib.util.find_spec("torchft") is None,
    reason="torchft is not installed here (it needs Python >= 3.10: not the Bluefog environment)")


def test_a_failure_costs_detection_recovery_rejoin_and_the_steps_taken_by_fewer_groups():
    fired = {"event": "1@step3:kill", "rank": 1, "steps": 2, "at": 10.0, "quorum_step": 2}
    log = [StepRecord(9.0, 1, 3, True), StepRecord(10.1, 2, 3, True),  # begun before it
           StepRecord(10.4, 2, 3, False),  # the allreduce cut off: noticed
           StepRecord(11.0, 3, 2, True), StepRecord(11.5, 4, 2, True),  # the survivors go on
           StepRecord(13.0, 5, 3, True)]  # the restarted group is back
    found = torchft_costs.cost(fired, log, batch=32)
    assert found["detection_seconds"] == pytest.approx(0.4)
    assert found["recovery_seconds"] == pytest.approx(1.0)
    assert found["rejoin_seconds"] == pytest.approx(3.0)
    assert (found["steps_with_fewer_groups"], found["samples_lost"]) == (2, 64)
    assert found["failed_after_step"] == 2 and found["rank"] == 1


def test_survivors_that_wait_for_the_quorum_until_the_group_is_back_lose_time_not_steps():
    # its loop's count is not the quorum's (it healed from a peer): the quorum's is used
    fired = {"event": "1@step3:kill", "rank": 1, "steps": 7, "at": 10.0, "quorum_step": 2}
    log = [StepRecord(9.5, 2, 2, True), StepRecord(14.0, 3, 2, True),
           StepRecord(14.5, 4, 2, True)]
    found = torchft_costs.cost(fired, log, batch=32)
    assert found["detection_seconds"] == found["recovery_seconds"] == pytest.approx(4.0)
    assert found["rejoin_seconds"] == pytest.approx(4.0)
    assert (found["steps_with_fewer_groups"], found["samples_lost"]) == (0, 0)


def test_a_group_that_never_rejoins_costs_every_step_after_it():
    fired = {"event": "2@5s:kill", "rank": 2, "steps": 1, "at": 1.0, "quorum_step": 1}
    log = [StepRecord(0.5, 1, 4, True), StepRecord(1.5, 2, 3, True),
           StepRecord(2.5, 3, 3, True)]
    found = torchft_costs.cost(fired, log, batch=10)
    assert found["detection_seconds"] == found["recovery_seconds"] == pytest.approx(0.5)
    assert found["rejoin_seconds"] is None
    assert (found["steps_with_fewer_groups"], found["samples_lost"]) == (2, 20)
    assert torchft_costs.short_quorums([fired], log, 4) == 0
    facts = {"costs": [found], "goodput": 12.5, "wall_seconds": 8.0, "replica_groups": 4,
             "short_quorums_before_failures": 0}
    said = torchft_costs.lines(facts, 20.0, "img")
    assert said[0] == ("Failure 2@5s:kill: detected after 0.5 s, first complete step after "
                       "it after 0.5 s, back in the quorum not seen; 2 steps with fewer "
                       "replica groups (20 img not learnt from)")
    assert said[1] == ("Goodput: 12.5 img/sec over 8.0 s of wall time, 4 replica groups, "
                       "failures included (during training: 20.0)")


def test_costs_read_from_a_quorum_that_was_short_before_any_failure_say_they_are_not_exact():
    fired = {"event": "2@5s:kill", "rank": 2, "steps": 3, "at": 4.0, "quorum_step": 3}
    log = [StepRecord(1.0, 1, 4, True), StepRecord(2.0, 2, 3, True),  # a group fell behind
           StepRecord(3.0, 3, 4, True), StepRecord(5.0, 4, 3, True)]
    assert torchft_costs.short_quorums([fired], log, 4) == 1
    facts = {"costs": [torchft_costs.cost(fired, log, 8)], "goodput": 1.0, "wall_seconds": 6.0,
             "replica_groups": 4, "short_quorums_before_failures": 1}
    said = torchft_costs.lines(facts, None, "img")
    assert said[1] == ("  (not exact: 1 steps before the first failure had a quorum of fewer "
                       "than 4 replica groups, groups falling behind and healing; the costs "
                       "above count quorum sizes)")


def test_a_sync_with_fewer_groups_costs_the_h_training_steps_it_stands_for():
    """local_sgd and diloco: group 0's log holds its syncs, every H-th step; the failing
    group fired after 12 of its own steps, its quorum at sync 2."""
    fired = {"event": "1@step13:kill", "rank": 1, "steps": 12, "quorum_step": 2, "at": 10.0}
    log = [StepRecord(9.0, 2, 2, True), StepRecord(15.0, 3, 1, True),
           StepRecord(16.0, 4, 1, True), StepRecord(30.0, 5, 2, True)]
    found = torchft_costs.cost(fired, log, batch=32, every=5)
    assert found["failed_after_step"] == 12
    assert found["detection_seconds"] == found["recovery_seconds"] == pytest.approx(5.0)
    assert found["rejoin_seconds"] == pytest.approx(20.0)
    assert (found["steps_with_fewer_groups"], found["samples_lost"]) == (10, 320)


def test_each_group_is_a_world_of_one_told_its_index_and_the_lighthouse(tmp_path):
    flags = torchft_launch.replica_flags([*TINY, "--fail", "1@step20"])
    assert flags[-2:] == ["--recovery", "torchft"]
    assert torchft_launch.replica_flags(["--recovery", "torchft"]) == ["--recovery", "torchft"]
    groups = torchft_launch.Groups(flags, 3, "http://h:1", str(tmp_path), (), 300.0)
    groups.starts[2] = 1
    argv, env = groups.command(2)
    assert argv[1:3] == ["-m", "commbench"] and argv[3:] == flags
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                "TORCHFT_LIGHTHOUSE", torchft_group.GROUP,
                                torchft_group.GROUPS, torchft_group.STARTS,
                                torchft_group.RECORDS)} == {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
        "TORCHFT_LIGHTHOUSE": "http://h:1", torchft_group.GROUP: "2",
        torchft_group.GROUPS: "3", torchft_group.STARTS: "1",
        torchft_group.RECORDS: str(tmp_path)}
    assert int(env["MASTER_PORT"]) > 0


class Ended:
    """A group's process that has ended with `code`."""

    def __init__(self, code):
        self.returncode, self.pid = code, 0

    def poll(self):
        return self.returncode


def watched(events, code, starts=1, records=""):
    groups = torchft_launch.Groups([], 3, "http://h:1", str(records), tuple(events), 300.0)
    groups.procs[1], groups.starts[1] = Ended(code), starts
    started = []
    groups.start = started.append
    return groups, started


def test_a_group_killed_by_its_event_is_started_again_after_its_rejoin(tmp_path):
    events = [FailEvent(1, step=3, rejoin=60.0)]
    groups, started = watched(events, 1, records=tmp_path)  # dead before its event fired
    assert groups.look_at(1) == ("replica group 1 ended with exit status 1 before its "
                                 "failure of --fail (1@step3:kill+60s) fired")
    torchft_group.fired_record(tmp_path, 0).write_text("{}")  # as the group does, first
    groups, started = watched(events, -9, records=tmp_path)
    assert groups.look_at(1) is None and started == []
    groups.due[1] = 0.0  # its +REJOIN has passed
    assert groups.look_at(1) is None and started == [1]


def test_a_death_no_event_explains_ends_the_job():
    groups, _ = watched([FailEvent(1, step=3)], -9, starts=2)  # its one event fired already
    assert "replica group 1 ended with exit status -9 and no failure of --fail" in \
        groups.look_at(1)
    groups, _ = watched([], 1)
    assert groups.look_at(1) is not None
    groups, _ = watched([], 2)
    assert groups.look_at(1) == "replica group 1 refused its flags"
    groups, started = watched([], 0)
    assert groups.look_at(1) is None and started == []


def connects(address: str) -> bool:
    where = urlsplit(address)
    try:
        with socket.create_connection((where.hostname, where.port), timeout=2):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def lighthouse_of_one(monkeypatch, tmp_path, store_port: int, *host: str):
    """torchft's lighthouse started here for group 0 of 2, whose environment is set
    before the lighthouse starts: its threads read the environment as they log (getenv),
    and a variable set meanwhile can free what they read (a segmentation fault in the
    fast tier, one run in three)."""
    port = torchft_launch.free_port()
    address = f"http://{socket.gethostname()}:{port}"  # as the lighthouse names itself
    for name, value in torchft_launch.group_env(0, 2, address, str(tmp_path), 0, store_port,
                                                *host).items():
        monkeypatch.setenv(name, value)
    with torchft_launch.lighthouse(None, port=port) as served:
        assert served == address
        yield address


@needs_torchft
def test_the_lighthouse_is_started_for_the_run_and_shut_down_after_it():
    with torchft_launch.lighthouse(None) as address:
        assert connects(address)
        torchft_launch.answers(address)  # a given address that answers is taken
    assert not connects(address)
    with pytest.raises(UsageError, match="argument --lighthouse: nothing answers at "):
        torchft_launch.answers(address, patience=2.0)


@needs_torchft
def test_the_lighthouse_is_shut_down_when_the_run_fails():
    with pytest.raises(RuntimeError), torchft_launch.lighthouse(None) as address:
        raise RuntimeError("a group failed")
    assert not connects(address)


@pytest.mark.parametrize("args, message", [
    (["--", *TINY, "--fail", "0@step3"], "argument --fail: 0@step3:kill fails replica group "
     "0, which writes the result; fail another"),
    (["--", *TINY, "--fail", "3@step3"], "argument --fail: rank 3 does not exist; this job of "
     "2 replica groups has ranks 0 to 1"),
    (["--", *TINY, "--dist-optimizer", "neighbor_allreduce"], "argument --recovery: torchft "
     "carries allreduce, local_sgd, diloco here (torchft's DistributedDataParallel, LocalSGD, "
     "DiLoCo), not neighbor_allreduce"),
    (["--", *TINY, "--dist-optimizer", "local_sgd", "--average-every", "5",
      "--local-warmup-steps", "2"], "argument --local-warmup-steps: torchft's LocalSGD syncs "
     "every H steps from the first: leave it out"),
    (["--", *TINY, "--dist-optimizer", "local_sgd", "--average-every", "5,10",
      "--machine-size", "1"], "argument --average-every: torchft's LocalSGD syncs over all "
     "replica groups alone: give one H"),
    (["--", *TINY, "--dist-optimizer", "diloco", "--average-every", "5", "--outer-dtype",
      "bf16"], "argument --outer-dtype: torchft's DiLoCo sends the pseudo-gradients in the "
     "parameters' own type: leave it out"),
    (["--", *TINY, "--dist-optimizer", "diloco", "--average-every", "8"], "argument "
     "--eval-every: under --recovery torchft the replica groups of diloco hold the same "
     "parameters only after a sync: evaluate every multiple of --average-every 8"),
    (["--", *TINY, "--recovery", "restart"], "argument --recovery: commbench torchft runs "
     "--recovery torchft, not restart"),
    (["--", *TINY, "--compression", "fp16"], "argument --recovery: torchft's allreduce sends "
     "the gradients as they are"),
    (["--", *TINY, "--checkpoint-every", "3"], "argument --checkpoint-every: checkpoints are "
     "taken for --recovery restart alone"),
    (["--", "--num-iters", "3"], "argument --recovery: a speed run times its steps, and "
     "torchft's quorum would change the world size it times"),
    (["--lighthouse", "http://127.0.0.1:1", "--", *TINY], "argument --lighthouse: nothing "
     "answers at http://127.0.0.1:1"),
])
def test_what_no_group_could_run_is_refused_in_one_line_before_any_starts(args, message,
                                                                          monkeypatch):
    # A group started would fail the test (not Popen itself, which torch's first import
    # may call to find its libraries).
    monkeypatch.setattr(torchft_launch.Groups, "start", None)
    assert refused("torchft", "-n", "2", *args).startswith("commbench: error: " + message)


def test_one_group_or_a_plain_launch_is_refused_in_one_line():
    assert refused("torchft", "-n", "1", "--", *TINY) == (
        "commbench: error: torchft: -n 1 leaves no peer to recover from; run 2 or more")
    assert refused("run", *TINY, "--recovery", "torchft").startswith(
        "commbench: error: argument --recovery: torchft runs each worker as a replica group "
        "of its own, which `commbench torchft -n N -- RUN FLAGS` starts")
    assert commbench("torchft", "--help").returncode == 0


@needs_torchft
def test_a_group_in_a_quorum_of_its_own_commits_its_steps_and_serves_where_it_stands(
        tmp_path, monkeypatch):
    import torch
    from torch.distributed import TCPStore

    from commbench.config.run_config import RunConfig
    from commbench.faults.restart import Progress

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with lighthouse_of_one(monkeypatch, tmp_path, store.port):
        replica = torchft_group.Replica(RunConfig(timeout=30.0),
                                        SimpleNamespace(rank=0, world_size=1), print, 8,
                                        SimpleNamespace(name="allreduce"))
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        step = replica.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
        try:
            before = model.weight.detach().clone()
            step(torch.randn(8, 4), torch.randint(0, 3, (8,)))
            assert replica.committed() and not torch.equal(before, model.weight)
            assert [(s.participants, s.committed) for s in replica.log] == [(1, True)]
            assert replica.manager.current_step() == 1
            replica.after_step(Progress(1, 0.5, 0.75, [], [2.0]))
            served = copy.deepcopy(replica.state())  # as the transport sends it
            trained = model.weight.detach().clone()
            with torch.no_grad():
                model.weight.zero_()
            replica.load(served)  # as a group that heals from it would
            assert torch.equal(model.weight, trained)
            skipped = []
            replica.skip, replica.drawn = lambda: skipped.append(1), 0  # as started again
            assert replica.healed() == Progress(1, 0.5, 0.75, [], [2.0])
            # its shard on to its peer's position: the one batch the peer drew
            assert (served["drawn"], replica.drawn, len(skipped)) == ("1", 1, 1)
            assert replica.healed() is None  # taken up once
        finally:
            replica.manager.shutdown(wait=True)  # its threads gone before the lighthouse


def test_what_torchft_is_handed_to_allreduce_is_counted_as_its_ring_sends_it():
    import torch

    from commbench.timing import spans, wire

    class Manager:
        failed = False

        def allreduce(self, tensor):
            return "work"

        def errored(self):
            return self.failed

    class Quorum:
        def size(self):
            return 3

    manager = Manager()
    handed = torchft_exchange.counted(manager.allreduce, Quorum())
    with spans.Recorder().measured_step() as recorder:
        assert handed(torch.zeros(300)) == "work"
        manager.failed = True  # torchft sends nothing once errored
        handed(torch.zeros(300))
    [span] = recorder.events
    assert (span.kind, span.nbytes) == ("handed", 1200)
    assert wire.Sent(span.sent, span.messages) == wire.ring_allreduce(1200, 3) == (1600, 4)
    assert handed(torch.zeros(8)) == "work"  # outside a measured step: nothing recorded


def test_local_sgd_and_diloco_map_their_flags_onto_torchfts_classes():
    from commbench.optimizers.diloco import DilocoOptions
    from commbench.optimizers.local_sgd import LocalSgdOptions

    allreduce = torchft_exchange.of(SimpleNamespace(name="allreduce"))
    local = torchft_exchange.of(SimpleNamespace(name="local_sgd",
                                                options=LocalSgdOptions(average_every=4)))
    diloco = torchft_exchange.of(SimpleNamespace(name="diloco",
                                                 options=DilocoOptions(average_every=6)))
    assert (allreduce.every, allreduce.keeps_own, allreduce.meets) == (1, False, False)
    assert (local.every, local.keeps_own, local.meets) == (4, True, True)
    assert (diloco.every, diloco.keeps_own, diloco.meets) == (6, False, True)


@pytest.fixture
def quorum_of_one(tmp_path, monkeypatch):
    """A Replica of `strategy` in a quorum of its own, its lighthouse started here."""
    from torch.distributed import TCPStore

    from commbench.config.run_config import RunConfig

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    made = []
    with lighthouse_of_one(monkeypatch, tmp_path, store.port):

        def make(strategy):
            made.append(torchft_group.Replica(RunConfig(timeout=30.0),
                                              SimpleNamespace(rank=0, world_size=1), print,
                                              8, strategy))
            return made[-1]

        yield make
        for replica in made:
            replica.manager.shutdown(wait=True)  # its threads gone before the lighthouse


def steps(replica, model, optimizer, n):
    import torch

    step = replica.wrap(model, optimizer)
    for _ in range(n):
        step(torch.randn(8, 4), torch.randint(0, 3, (8,)))
        yield replica.committed()


@needs_torchft
def test_diloco_syncs_every_h_steps_and_serves_its_outer_optimizer_and_last_sync(
        quorum_of_one):
    import torch

    from commbench.optimizers.diloco import DilocoOptions

    diloco = SimpleNamespace(name="diloco", meetings=0, options=DilocoOptions(
        average_every=2, outer_lr=0.5, outer_momentum=0.8))
    replica = quorum_of_one(diloco)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    taken = steps(replica, model, torch.optim.SGD(model.parameters(), lr=0.1), 6)
    assert all(next(taken) for _ in range(4))
    # One quorum step per sync, after the 2nd and the 4th step: each a meeting.
    assert [(s.step, s.participants, s.committed) for s in replica.log] == [
        (1, 1, True), (2, 1, True)]
    assert diloco.meetings == 2 and replica.manager.current_step() == 2
    served = copy.deepcopy(replica.manager._manager_state_dict()["user"])
    fragment = served["StreamingDiLoCoFragment_0"]  # torchft's DiLoCo's own, beside ours
    outer = fragment["outer_optimizer"]["param_groups"][0]
    assert (outer["lr"], outer["momentum"], outer["nesterov"]) == (0.5, 0.8, True)
    assert fragment["outer_optimizer"]["state"]  # its momentum, which a healing group takes
    assert torch.equal(fragment["original_parameters"]["weight"], model.weight)
    assert set(served["default"]) == {"model", "optimizer", "progress", "drawn"}
    # Healed from a peer 5 syncs along (a group started late): the quorum's syncs counted.
    replica.manager.load_state_dict({"step": 5, "batches_committed": 5})
    assert all(taken)
    assert diloco.meetings == 6 == replica.manager.current_step()


@needs_torchft
@pytest.mark.parametrize("name, undone", [("diloco", True), ("local_sgd", False)])
def test_a_diloco_sync_not_committed_undoes_its_steps_where_local_sgds_stand(
        name, undone, quorum_of_one, monkeypatch):
    import torch
    from torchft import Manager

    from commbench.faults.restart import Progress
    from commbench.optimizers.diloco import DilocoOptions
    from commbench.optimizers.local_sgd import LocalSgdOptions

    monkeypatch.setattr(Manager, "should_commit", lambda self, timeout=None: False)
    options = (DilocoOptions if undone else LocalSgdOptions)(average_every=2)
    replica = quorum_of_one(SimpleNamespace(name=name, meetings=0, options=options))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    first = model.weight.detach().clone()
    taken = steps(replica, model, torch.optim.SGD(model.parameters(), lr=0.1), 2)
    assert next(taken)  # a step of its own, before the sync
    since = time.perf_counter()
    replica.after_step(Progress(1, 0.5, 0.75, [], [2.0]))
    assert next(taken) is not undone  # the sync, not committed
    assert torch.equal(model.weight, first) is undone
    found = replica.healed()
    if undone:  # back to the last committed sync, the start: its time spent, once
        assert found == Progress(0, 0.5, found.wall_seconds)
        assert 0.75 <= found.wall_seconds <= 0.75 + time.perf_counter() - since
    else:
        assert found is None


def test_the_launcher_says_whether_the_groups_ended_with_the_same_parameters(tmp_path):
    from commbench.faults.restart import write

    def ended(group):
        return tmp_path / f"ended-{group}.record"

    write(ended(0), {"steps": 150, "parameters_sha256": "ab" * 32})
    assert torchft_group.ended_alike(tmp_path, 2) is None  # group 1 did not end its run
    write(ended(1), {"steps": 150, "parameters_sha256": "ab" * 32})
    assert torchft_group.ended_alike(tmp_path, 2) == (
        "the 2 replica groups ended at step 150 with the same parameters (sha256 "
        "abababababababab)")
    write(ended(1), {"steps": 149, "parameters_sha256": "cd" * 32})
    assert torchft_group.ended_alike(tmp_path, 2).startswith(
        "the 2 replica groups ended at step 149, 150 with 2 different parameters")


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_a_killed_group_is_started_again_heals_from_its_peer_and_both_reach_the_end(tmp_path):
    """Two replica groups of a tiny allreduce run; group 1 killed at its 20th step and
    started again 8 s later. Group 0 goes on alone once the lighthouse has given group 1
    up, group 1 heals from group 0 and rejoins, and group 0's result, written at
    --max-epochs, says what the failure cost."""
    began = time.monotonic()
    done = run([PYTHON, "-m", "commbench", "torchft", "-n", "2", "--", *TINY_TASK,
                "--max-epochs", "30", "--eval-every", "50", "--timeout", "60",
                "--fail", "1@step20+8s", "--results-dir", str(tmp_path)], timeout=420)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-3000:]
    assert "failure injected by --fail (1@step20:kill+8s), not a bug" in done.stderr
    doc = only_result(tmp_path)  # group 0's alone
    assert doc["summary"]["steps"] == 150  # 30 epochs of 5 steps: the planned end
    recovery = doc["recovery"]
    assert recovery["policy"] == "torchft" and recovery["replica_groups"] == 2
    # goodput's wall clock covers the loop's, within the job's life
    assert doc["summary"]["wall_seconds"] <= recovery["wall_seconds"] < took
    # each step's gradients through gloo's ring over the quorum's two groups: one copy
    # of them a step; nothing in the steps group 0 took alone
    wire = doc["summary"]["wire"]
    assert 0 < wire["communicating_steps"] < 1 and wire["messages_per_step"] > 0
    from commbench.job.models import build_model

    gradients = 4 * sum(p.numel() for p in build_model("resnet18", 10).parameters())
    assert gradients <= wire["bytes_per_communicating_step"] < 1.01 * gradients
    assert doc["curve"][-1]["bytes_sent"] > 0
    [cost] = recovery["costs"]
    assert cost["event"] == "1@step20:kill+8s" and cost["failed_after_step"] == 19
    assert 0 <= cost["detection_seconds"] <= cost["recovery_seconds"] < 60
    assert 8 < cost["rejoin_seconds"] < 120 and cost["steps_with_fewer_groups"] > 0
    assert re.search(r"Failure 1@step20:kill\+8s: detected after [\d.]+ s", done.stdout)
    assert "Goodput: " in done.stdout


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_a_killed_diloco_group_heals_from_its_peer_and_both_end_with_the_same_parameters(
        tmp_path):
    """diloco under torchft, in its regime: a language model with AdamW inside. The
    quorum forms at each sync, every 5th step. Group 1 is killed before its 20th step and
    started again 8 s later; group 0's sync at step 20 goes on alone once the lighthouse
    has given group 1 up, and group 1 heals at a later sync (the model, AdamW's state
    and the outer optimizer's, the last sync's parameters). Both reach the planned end,
    a sync, with the same parameters."""
    done = run([PYTHON, "-m", "commbench", "torchft", "-n", "2", "--", *TINY_LM,
                "--max-epochs", "30", "--eval-every", "50", "--timeout", "60",
                "--dist-optimizer", "diloco", "--average-every", "5",
                "--fail", "1@step20+8s", "--results-dir", str(tmp_path)], timeout=420,
               env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    assert doc["summary"]["steps"] == 150 and doc["strategy"]["meetings"] == 30
    recovery = doc["recovery"]
    [cost] = recovery["costs"]
    assert cost["event"] == "1@step20:kill+8s" and cost["failed_after_step"] == 19
    assert 0 <= cost["detection_seconds"] <= cost["recovery_seconds"] < 60
    assert 8 < cost["rejoin_seconds"] < 120
    # Syncs with group 0 alone, each the 5 training steps it stands for.
    assert cost["steps_with_fewer_groups"] > 0 and cost["steps_with_fewer_groups"] % 5 == 0
    # a group's steps count tokens: 16 sequences of 16
    assert cost["samples_lost"] == cost["steps_with_fewer_groups"] * 16 * 16
    digest = recovery["final_parameters_sha256"]
    assert (f"commbench torchft: the 2 replica groups ended at step 150 with the same "
            f"parameters (sha256 {digest[:16]})") in done.stdout


def test_a_stopped_group_is_killed_once_the_timeout_has_passed():
    groups = torchft_launch.Groups([], 2, "http://h:1", "", (), timeout=0.0)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert groups.watch_stopped(1, proc, 0.0) is None and 1 not in groups.stopped
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while 1 not in groups.stopped and time.monotonic() < deadline:
            groups.watch_stopped(1, proc, time.monotonic())
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_report_says_a_torchft_runs_groups_goodput_and_what_its_failures_cost(tmp_path):
    """Its workers are its replica groups: the result is group 0's, a world of one."""
    path, doc = fixture("allreduce", 42)
    doc = copy.deepcopy(doc)
    doc["recovery"] = {
        "policy": "torchft", "replica_groups": 3, "lighthouse": "http://h:1",
        "wall_seconds": 40.0, "goodput": 20.25, "wall_time_to_target": 40.0,
        "final_model_sha256": "0" * 64,
        "costs": [{"event": "1@step6:kill", "rank": 1, "failed_after_step": 5,
                   "detection_seconds": 0.5, "recovery_seconds": 5.25, "rejoin_seconds": 12.0,
                   "steps_with_fewer_groups": 9, "samples_lost": 288},
                  {"event": "2@30s:kill", "rank": 2, "failed_after_step": 80,
                   "detection_seconds": None, "recovery_seconds": None,
                   "rejoin_seconds": None, "steps_with_fewer_groups": 0, "samples_lost": 0}]}
    written = write_run(tmp_path, path.name, doc)
    code, text, err = run_report([tmp_path])
    assert code == 0 and err == "", err
    lines = [li for li in text.splitlines() if "--recovery torchft" in li]
    assert len(lines) == 1 and lines[0].endswith(
        ", N=3, seed 42: --recovery torchft, 3 replica groups; goodput 20.2 img/sec over 40.0 s "
        "of wall time; 1@step6:kill: 5.2 s to the first complete step after it, 9 steps with "
        f"fewer groups; 2@30s:kill: no complete step after it, 0 steps with fewer groups; "
        f"{written}"), lines


def test_a_bucket_the_manager_no_longer_reduces_is_completed_with_its_own_buffer():
    """torchft #304: after a failed allreduce the Manager answers with a work whose
    future holds no inner future; torchft's own hook asserts there, ending the survivor."""
    torch = pytest.importorskip("torch")
    work = pytest.importorskip("torchft.work")
    from commbench.faults.torchft_fixes import completed_bucket

    buffer = torch.arange(4.0)
    manager = SimpleNamespace(allreduce=work._DummyWork)
    bucket = SimpleNamespace(buffer=lambda: buffer)
    done = completed_bucket(manager, bucket)
    assert done.done() and done.value() is buffer
    reduced = torch.futures.Future()
    reduced.set_result(buffer * 2)
    managed = SimpleNamespace(wait=lambda: True,
                              get_future=lambda: SimpleNamespace(_fut=reduced))
    assert completed_bucket(SimpleNamespace(allreduce=lambda t: managed), bucket) is reduced


def test_a_replica_groups_error_line_names_the_group_not_its_rank_0(monkeypatch, capsys):
    from commbench.job import failure

    monkeypatch.setenv(torchft_group.GROUP, "2")
    monkeypatch.setattr(failure, "launcher_first", lambda error: 0.0)
    monkeypatch.setattr(failure, "_abort", lambda code: None)
    failure.describe_and_abort(RuntimeError("http2 error\nmore"))
    assert capsys.readouterr().err == "commbench: error: replica group 2: RuntimeError: " \
        "http2 error\n"


def test_a_group_that_lagged_behind_group_0_fires_at_an_older_step_and_costs_no_time_back():
    fired = {"event": "3@58s:kill", "rank": 3, "steps": 40, "at": 10.0, "quorum_step": 4}
    log = [StepRecord(8.0, 4, 4, True), StepRecord(9.0, 5, 4, True),  # before it fired
           StepRecord(12.0, 6, 3, True)]
    found = torchft_costs.cost(fired, log, batch=8)
    assert found["detection_seconds"] == found["recovery_seconds"] == pytest.approx(2.0)


def test_every_group_stops_where_group_0s_evaluation_says(tmp_path):
    """Each group scores its own model (its own BatchNorm statistics): group 0's verdict
    decides for all, and a group that does not hear it within --timeout says so."""
    import threading

    writer = threading.Timer(0.3, torchft_group.verdict, (tmp_path, 0, 250, "target", 5.0))
    writer.start()
    try:  # group 2 scored the target a step early; it waits for group 0's word
        assert torchft_group.verdict(tmp_path, 2, 250, "target", 5.0) == "target"
        assert torchft_group.verdict(tmp_path, 0, 300, None, 5.0) is None
        assert torchft_group.verdict(tmp_path, 2, 300, "target", 5.0) is None
    finally:
        writer.join()
    with pytest.raises(TimeoutError, match=r"^replica group 0 did not say within --timeout "
                                           r"\(0\.2 s\) whether training stops at step 350$"):
        torchft_group.verdict(tmp_path, 1, 350, None, 0.2)
