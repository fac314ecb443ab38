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
there (`Survival`).

A rank killed with a rejoin (`--fail 2@step8:kill+5s`) comes back as a fresh process
(commbench.faults.gossip_rejoin) and asks to be admitted; the members admit it between
steps, where no exchange is in flight: rank 0 decides whom (`Survival.asked`), and the
members and the newcomers meet in a room of their own (`Survival.admit`,
`Survival.admitted`). A rank is lost while it was announced lost more often than it was
admitted again, so that a rank lost a second time counts once more."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import (Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence,
                    Tuple)

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
    joined: Tuple[int, ...] = ()  # the ranks admitted again, among the survivors


class Survival:
    """This rank's side of the agreement, in a store every rank reaches."""

    def __init__(self, store: Any, rank: int, world_size: int, seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.seconds, self.clock = seconds, clock
        self.lost: Tuple[int, ...] = ()
        self.losses = 0  # announced in all, as the last meeting counted them
        self.admissions = 0  # ranks admitted again since the job started
        self.asked_as = 0  # a newcomer's: its admissions before the one it asked for
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
        """Say that `peers` are lost; the first rank to say it counts it (once per time a
        peer is lost: its admissions so far name the time)."""
        for peer in peers:
            if self.store.add(f"{PREFIX}/lost/{peer}/{self._admissions_of(peer)}", 1) == 1:
                self.store.add(f"{PREFIX}/losses/{peer}", 1)  # before the count: see meet
                self.store.add(f"{PREFIX}/lost-count", 1)

    def news(self) -> bool:
        """Whether more losses are announced than this rank knows of (one round trip:
        counters are read by adding 0)."""
        return self.store.add(f"{PREFIX}/lost-count", 0) > self.losses

    @property
    def generation(self) -> int:
        """How often the members changed: the same on every member, a part of the keys
        they meet under."""
        return self.losses + self.admissions

    def _now_lost(self) -> Tuple[Tuple[int, ...], int]:
        """(the ranks lost now, the losses announced in all), from the store."""
        lost, losses = [], 0
        for r in range(self.world_size):
            times = self.store.add(f"{PREFIX}/losses/{r}", 0)
            losses += times
            if times > self.store.add(f"{PREFIX}/admitted/{r}", 0):
                lost.append(r)
        return tuple(lost), losses

    def meet(self, step: int) -> Meeting:
        """Come to the meeting of the survivors, having gone as far as exchange `step`;
        TimeoutError naming the absent when a survivor does not come within --timeout,
        or when this rank itself was announced lost (alive, but silent for longer than
        its peers waited: it cannot take its place again). A loss announced meanwhile
        starts a meeting of the fewer survivors."""
        while True:
            self.lost, self.losses = self._now_lost()
            if self.rank in self.lost:
                raise TimeoutError(f"gossip recovery: rank {self.rank} answered its peers too "
                                   "late, and they went on without it (--timeout)")
            survivors = tuple(r for r in range(self.world_size) if r not in self.lost)
            room = f"{PREFIX}/meeting-{self.losses}"
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

    def ask(self) -> None:
        """A newcomer: ask the members to admit this rank again (the number of its
        admissions so far names the answer: rank 0 counts this one as it answers)."""
        self.asked_as = self._admissions_of(self.rank)
        self.store.set(f"{PREFIX}/rejoin/{self.rank}/{self.asked_as}", repr(time.time()))

    def decide(self, step: int, facts: Dict[str, Any]) -> Tuple[int, ...]:
        """Every member, all here at admission point `step` with no loss pending: whom
        they admit. Rank 0 decides, and writes each newcomer where the members stand
        (`facts`, with the admission's keys); the others read it."""
        key = f"{PREFIX}/admit-{self.generation}-{step}"
        if self.rank != 0:
            self._wait_for(key, "the decision whom to admit")
            return tuple(json.loads(self.store.get(key)))
        joined = tuple(r for r in self.lost if self.store.check([self._asked(r)]))
        members = sorted(set(range(self.world_size)) - set(self.lost) | set(joined))
        for rank in joined:
            self.store.set(f"{PREFIX}/admission/{rank}/{self._admissions_of(rank)}", json.dumps({
                **facts, "step": step, "losses": self.losses, "admissions": self.admissions,
                "lost": self.lost, "members": members, "joined": joined}))
            self.store.add(f"{PREFIX}/admitted/{rank}", 1)
        self.store.set(key, json.dumps(joined))
        return joined

    def admit(self, step: int, joined: Sequence[int]) -> Meeting:
        """Every member: meet the newcomers `joined` in the room of this admission
        (TimeoutError naming the absent after --timeout)."""
        room = f"{PREFIX}/admission-{self.generation}-{step}"
        lost = tuple(r for r in self.lost if r not in joined)
        members = tuple(r for r in range(self.world_size) if r not in lost)
        self._enter(room, members, self.clock() + self.seconds)
        self.lost, self.admissions = lost, self.admissions + len(joined)
        return Meeting(lost, members, step, tuple(joined))

    def admitted(self) -> Tuple[Meeting, Dict[str, Any]]:
        """A newcomer that asked: wait, with no deadline, for the members to admit it
        (TimeoutError once the job ended, or rank 0's beat stood still for --timeout),
        and meet them. The meeting, and the record rank 0 wrote (decide)."""
        key = f"{PREFIX}/admission/{self.rank}/{self.asked_as}"
        self._wait_for(key, "the members' admission", ended=True)
        record = json.loads(self.store.get(key))
        self.losses, self.admissions = record["losses"], record["admissions"]
        room = f"{PREFIX}/admission-{self.generation}-{record['step']}"
        self.lost = tuple(r for r in record["lost"] if r not in record["joined"])
        self.admissions += len(record["joined"])
        self._enter(room, tuple(record["members"]), None)
        return Meeting(self.lost, tuple(record["members"]), record["step"],
                       tuple(record["joined"])), record

    def part(self, members: int) -> None:
        """Before this process ends: until all `members` got here too, for --timeout at
        most. A process that ends while a peer still reads its last message of a
        collective closes the connection under it; and rank 0, whose process serves the
        store, leaves last, once the others saw that all came."""
        key = f"{PREFIX}/parted-{self.generation}"
        self.store.add(key, 1)
        deadline = self.clock() + self.seconds
        while self.store.add(key, 0) < members and self.clock() < deadline:
            time.sleep(POLL_SECONDS)
        if self.rank != 0:
            self.store.add(f"{key}/saw", 1)
            return
        while self.store.add(f"{key}/saw", 0) < members - 1 and self.clock() < deadline:
            time.sleep(POLL_SECONDS)

    def _asked(self, rank: int) -> str:
        return f"{PREFIX}/rejoin/{rank}/{self._admissions_of(rank)}"

    def _admissions_of(self, rank: int) -> int:
        return self.store.add(f"{PREFIX}/admitted/{rank}", 0)

    def _enter(self, room: str, members: Sequence[int], deadline: Optional[float]) -> None:
        """Come into `room` and wait for all `members` (a newcomer, with no deadline: for
        as long as rank 0 beats)."""
        self.store.set(f"{room}/{self.rank}", "here")
        self.store.add(f"{room}/here", 1)
        while self.store.add(f"{room}/here", 0) < len(members):
            if deadline is not None and self.clock() > deadline:
                absent = [r for r in members if not self.store.check([f"{room}/{r}"])]
                raise TimeoutError(f"gossip recovery: ranks {absent} did not come to the "
                                   f"admission within {self.seconds:g} s (--timeout)")
            if deadline is None and self.stopped({0}):
                raise TimeoutError("gossip recovery: rank 0 went silent during the admission")
            time.sleep(POLL_SECONDS)

    def _wait_for(self, key: str, what: str, ended: bool = False) -> None:
        """Until `key` is set; TimeoutError when rank 0's beat stood still for --timeout
        first (or, `ended`, the job ended)."""
        while not self.store.check([key]):
            if ended and self.store.check([f"{PREFIX}/ended"]):
                raise TimeoutError(f"gossip recovery: the job ended before {what} of rank "
                                   f"{self.rank}")
            if self.stopped({0}):
                raise TimeoutError(f"gossip recovery: rank 0 went silent before {what}")
            time.sleep(POLL_SECONDS * NEWS_EVERY)
