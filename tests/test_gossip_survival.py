"""Gossip's survivors learn of a lost rank and agree on what follows
(commbench.faults.gossip_survival): a wait ends with the peers whose messages failed or
stayed silent, or with another rank's news; the survivors' meeting settles the lost ranks
and the exchange they resume at. And, through mpiexec --enable-recovery, four ranks
averaging over gloo lose one, killed or stopped, and the others go on around it: their
mean is kept by every mixing step after the failure and they reach it again."""

import json
import threading
import time
from pathlib import Path

import pytest

from commbench.faults.gossip_exchange import posted
from commbench.faults.gossip_survival import Meeting, Survival, Waited, waited
from launchers import PYTHON, mpiexec_path, run_once_more_if_the_machine_failed

stores_check = pytest.mark.skipif(
    not hasattr(__import__("torch").distributed.HashStore, "check"),
    reason="this torch's stores cannot check a key (torch 1.10: the Bluefog environment); "
    "gossip recovery needs a current torch")

PROGRAM = Path(__file__).resolve().parent / "programs" / "gossip_survivors.py"


class Work:
    """A message's Work: done once `arrives` is set, or failing as a dead peer's does."""

    def __init__(self, fails=False):
        self.arrives, self.fails = threading.Event(), fails

    def wait(self, timeout):
        if self.fails:
            raise RuntimeError("Connection closed by peer")
        self.arrives.wait()


def arrived():
    work = Work()
    work.arrives.set()
    return work


def store():
    import torch.distributed as dist

    return dist.HashStore()


def survival(seconds=5.0, rank=0, world_size=4, shared=None):
    return Survival(shared or store(), rank, world_size, seconds)


def test_a_wait_ends_when_every_message_arrived():
    assert waited([(1, arrived()), (3, arrived())], survival()) == Waited((), False)


def test_a_message_that_fails_names_its_peer_at_once():
    began = time.monotonic()
    assert waited([(1, arrived()), (2, Work(fails=True)), (3, Work())],
                  survival()) == Waited((2,), False)
    assert time.monotonic() - began < 1.0


def test_a_message_gloo_refuses_as_it_is_posted_names_its_peer_too(monkeypatch):
    import torch
    import torch.distributed as dist

    def closed(tensor, peer, tag=0):
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(dist, "isend", closed)
    refused = posted("send", torch.zeros(1), 2, 7)
    assert waited([(1, arrived()), (2, refused)], survival()) == Waited((2,), False)


def test_a_silent_peer_whose_beat_stood_still_for_the_timeout_is_lost():
    began = time.monotonic()
    assert waited([(1, arrived()), (2, Work())], survival(0.3)) == Waited((2,), False)
    assert time.monotonic() - began >= 0.3


def test_a_silent_peer_that_still_beats_is_waited_for():
    shared = store()
    survival(0.2, rank=2, shared=shared).beat()  # alive, waiting on someone else
    late = Work()
    threading.Timer(1.0, late.arrives.set).start()
    assert waited([(2, late)], survival(0.2, shared=shared)) == Waited((), False)


def test_another_ranks_news_ends_the_wait_without_naming_anyone():
    shared = store()
    survival(shared=shared, rank=1).announce([3])
    assert waited([(1, Work())], survival(shared=shared)) == Waited((), True)


def on_threads(calls):
    """Each rank's call, on a thread of its own; rank -> what it returned."""
    found = {}

    def call(rank, what):
        found[rank] = what()

    threads = [threading.Thread(target=call, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return found


def meet_all(shared, world_size, steps, seconds=5.0):
    """Each rank of `steps` (rank -> the exchange it got to) at the meeting, on threads."""
    return on_threads({rank: (lambda rank=rank, step=step: Survival(
        shared, rank, world_size, seconds).meet(step)) for rank, step in steps.items()})


def test_survivors_agree_on_the_lost_rank_and_resume_after_the_furthest_of_them():
    shared = store()
    Survival(shared, 1, 4, 5.0).announce([2])
    Survival(shared, 3, 4, 5.0).announce([2])  # found twice, counted once
    met = meet_all(shared, 4, {0: 11, 1: 10, 3: 10})
    assert met == dict.fromkeys((0, 1, 3), Meeting((2,), (0, 1, 3), 12))


def test_news_is_of_more_lost_ranks_than_this_one_knows():
    shared = store()
    survival = Survival(shared, 0, 3, 5.0)
    assert not survival.news()
    Survival(shared, 1, 3, 5.0).announce([2])
    assert survival.news()
    other = threading.Thread(target=Survival(shared, 1, 3, 5.0).meet, args=(4,))
    other.start()
    survival.meet(4)
    other.join(30)
    assert not survival.news()


@stores_check
@pytest.mark.parametrize("rank, message", [
    (0, "gossip recovery: ranks [1] did not come to the survivors' meeting within 0.2 s "
        "(--timeout)"),
    (2, "gossip recovery: rank 2 answered its peers too late, and they went on without it "
        "(--timeout)")])
def test_an_absent_survivor_or_a_slow_rank_left_behind_is_named_in_one_line(rank, message):
    shared = store()
    Survival(shared, 1, 3, 0.2).announce([2])
    with pytest.raises(TimeoutError) as error:
        Survival(shared, rank, 3, 0.2).meet(7)
    assert str(error.value) == message


def test_a_loss_announced_during_the_meeting_starts_one_of_fewer_survivors():
    shared = store()
    Survival(shared, 0, 4, 5.0).announce([3])
    announced = threading.Timer(0.3, lambda: Survival(shared, 0, 4, 5.0).announce([2]))
    announced.start()
    met = meet_all(shared, 4, {0: 4, 1: 6})  # rank 2 never comes: it is lost too
    announced.join()
    assert met == dict.fromkeys((0, 1), Meeting((2, 3), (0, 1), 7))


@pytest.mark.mpi
@pytest.mark.timeout(700)
@pytest.mark.parametrize("kind, detected_within", [("kill", 5.0), ("stop", 10.0 + 5.0)])
def test_survivors_of_a_lost_rank_keep_their_mean_and_reach_it_again(kind, detected_within):
    cmd = [mpiexec_path(), "-n", "4", "--oversubscribe", "--bind-to", "none",
           "--enable-recovery", PYTHON, str(PROGRAM), kind]
    done = run_once_more_if_the_machine_failed(cmd, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["lost"] == [2]
    # The stopped rank is found at the program's --timeout (10 s), the killed one as its
    # connections close.
    assert 0 < facts["detection_seconds"] < detected_within
    assert facts["mean_at_end"] == pytest.approx(facts["mean_at_meeting"], abs=1e-9)
    assert facts["spread_at_meeting"] > 1.0
    assert facts["spread_at_end"] < 1e-6
