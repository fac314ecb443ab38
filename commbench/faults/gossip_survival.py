"""How gossip's survivors learn of a lost rank and agree on what follows (issue 56,
`--recovery gossip`, which commbench.faults.gossip_recovery makes of it): the runtime
half of a recovery whose mathematics is commbench.topology.survivors.

Measured on this project's launcher (Open MPI 5.0.11's PRRTE, torch 2.14's gloo; the
findings are in docs/run.md, "Surviving a lost rank at run time"):
- `mpiexec --enable-recovery` (or `--with-ft ulfm`) keeps the other processes running
  when one dies; without it PRRTE ends the job, as commbench's default wants.
- A gloo message to or from a killed peer fails within tens of milliseconds
  ("Connection closed by peer"); a stopped peer's never completes. Messages between two
  live peers go on working.
- But a gloo wait that times out closes its pair for good ("Application timeout caused
  pair closure"), even between two live ranks, and a gloo point-to-point Work reports
  itself complete only once waited on. So a survivor never lets gloo time a wait out:
  each message is waited on by a thread of its own, with no practical limit (`waited`).
- A message that does not come does not say why: its sender may be stopped, or live
  and itself waiting for a stopped rank. So every rank beats in the store from a thread
  of its own, and a silent peer is lost only once its beat has stood still for --timeout
  (a stopped process's threads stop with it; a waiting one's go on).

The survivors then agree in the job's rendezvous store, served by rank 0 (which no
gossip schedule may fail): the first rank to find a peer lost announces it, every rank
that sees the news abandons its exchange and comes to a meeting, and the meeting settles
the lost ranks and the step from which the survivors mix again, the first after the
furthest any of them had gone, so that every survivor counts the same exchanges from
there (`Survival`)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Sequence, Tuple

PREFIX = "commbench/gossip"
# How often a waiting rank looks for a finished message, and asks the store for news
# and for its silent peers' beats; how many beats a rank gives per --timeout.
POLL_SECONDS = 0.005
NEWS_EVERY = 10
BEATS_PER_TIMEOUT = 4
# A thread's wait for one message: never reached, since gloo would close the pair.
FOREVER = timedelta(days=365)


class Waited(NamedTuple):
    """The end of a wait for one exchange's messages: the peers found lost (their message
    failed, or they were silent while their beat stood still), and whether another
    rank's announcement ended the wait first."""

    lost: Tuple[int, ...]
    news: bool


def waited(messages: Sequence[Tuple[int, Any]], survival: "Survival") -> Waited:
    """Wait for (peer, Work) messages: until all are done, one fails, a peer still owing
    one has stopped beating, or another rank announces a loss."""
    done: List[int] = []
    failed: List[int] = []

    def wait(peer: int, work: Any) -> None:
        try:
            work.wait(FOREVER)
        except RuntimeError:  # the peer's connection closed: it is gone
            failed.append(peer)
        done.append(peer)

    for peer, work in messages:
        threading.Thread(target=wait, args=(peer, work), daemon=True,
                         name=f"commbench-gossip-wait-{peer}").start()
    polls = 0
    while len(done) < len(messages) and not failed:
        polls += 1
        if polls % NEWS_EVERY == 0:
            if survival.news():
                return Waited((), True)
            stopped = survival.stopped({peer for peer, _ in messages} - set(done))
            if stopped:
                return Waited(stopped, False)
        time.sleep(POLL_SECONDS)
    return Waited(tuple(sorted(set(failed))), False)


class Meeting(NamedTuple):
    """What the survivors agreed: the lost ranks, the survivors, and the first exchange
    they all take together again."""

    lost: Tuple[int, ...]
    survivors: Tuple[int, ...]
    resume_step: int


class Survival:
    """This rank's side of the agreement, in a store every rank reaches."""

    def __init__(self, store: Any, rank: int, world_size: int, seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.seconds, self.clock = seconds, clock
        self.lost: Tuple[int, ...] = ()
        self._beats: Dict[int, Tuple[int, float]] = {}  # peer -> (its beat, seen since)

    def beat(self) -> None:
        """Beat in the store every --timeout / BEATS_PER_TIMEOUT, from a daemon thread,
        for as long as the process runs."""
        def beating() -> None:
            while True:
                self.store.add(f"{PREFIX}/beat/{self.rank}", 1)
                time.sleep(self.seconds / BEATS_PER_TIMEOUT)

        threading.Thread(target=beating, daemon=True, name="commbench-gossip-beat").start()

    def stopped(self, peers: Iterable[int]) -> Tuple[int, ...]:
        """Those of `peers` whose beat has stood still for --timeout, as this rank saw it."""
        now, still = self.clock(), []
        for peer in sorted(peers):
            beat = self.store.add(f"{PREFIX}/beat/{peer}", 0)
            seen, since = self._beats.get(peer, (None, now))
            if beat != seen:
                self._beats[peer] = (beat, now)
            elif now - since >= self.seconds:
                still.append(peer)
        return tuple(still)

    def announce(self, peers: Sequence[int]) -> None:
        """Say that `peers` are lost; the first rank to say it counts it."""
        for peer in peers:
            if self.store.add(f"{PREFIX}/lost/{peer}", 1) == 1:
                self.store.add(f"{PREFIX}/lost-count", 1)

    def news(self) -> bool:
        """Whether more ranks are announced lost than this rank knows of (one round trip:
        counters are read by adding 0)."""
        return self.store.add(f"{PREFIX}/lost-count", 0) > len(self.lost)

    def meet(self, step: int) -> Meeting:
        """Come to the meeting of the survivors, having gone as far as exchange `step`;
        TimeoutError naming the absent when a survivor does not come within --timeout,
        or when this rank itself was announced lost (alive, but silent for longer than
        its peers waited: it cannot take its place again). A loss announced meanwhile
        starts a meeting of the fewer survivors."""
        while True:
            self.lost = tuple(r for r in range(self.world_size)
                              if self.store.add(f"{PREFIX}/lost/{r}", 0) > 0)
            if self.rank in self.lost:
                raise TimeoutError(f"gossip recovery: rank {self.rank} answered its peers too "
                                   "late, and they went on without it (--timeout)")
            survivors = tuple(r for r in range(self.world_size) if r not in self.lost)
            room = f"{PREFIX}/meeting-{len(self.lost)}"
            self.store.set(f"{room}/step/{self.rank}", str(step))
            self.store.add(f"{room}/here", 1)
            if self._everyone_came(room, len(survivors)):
                steps = [int(self.store.get(f"{room}/step/{r}")) for r in survivors]
                return Meeting(self.lost, survivors, max(steps) + 1)
            if not self.news():
                absent = [r for r in survivors if not self.store.check([f"{room}/step/{r}"])]
                raise TimeoutError(f"gossip recovery: ranks {absent} did not come to the "
                                   f"survivors' meeting within {self.seconds:g} s (--timeout)")

    def _everyone_came(self, room: str, survivors: int) -> bool:
        """Whether all survivors came before the deadline (False: or news came first)."""
        deadline = self.clock() + self.seconds
        while self.store.add(f"{room}/here", 0) < survivors:
            if self.news() or self.clock() > deadline:
                return False
            time.sleep(POLL_SECONDS)
        return True
