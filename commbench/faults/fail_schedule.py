"""Failures on purpose: `--fail SPEC`, the schedule of ranks that kill or stop themselves,
or cut their machine off the network, in the middle of a run, so that what a failure
costs can be measured (issue 56).

A SPEC is either explicit events, comma-separated, each `RANK@WHEN[:KIND][+REJOIN]`:
WHEN is `stepN` (as the rank's Nth training step begins, warm-up included, counted from
1) or a duration such as `45s` (once that much time has passed since the rank's first
training step); KIND is `kill` (SIGKILL, the default), `stop` (SIGSTOP: alive but
silent) or `cut` (on an emulated cluster's machine, its link taken down: the rank, and
every process on its machine, alive but unreachable, until the rank's process ends);
REJOIN is a duration after which the rank starts again (a cut: its link comes back).
Or it is a seeded random schedule, `mtbf=60s,seed=1[,kind=stop][,rejoin=10s]`, expanded
into the same events: every rank but rank 0 (which writes the result) fails once, in an
order and at times drawn from the seed, the times between failures exponential with the
given mean, each failed rank starting again `rejoin` after its failure where that is
given. The expansion depends
on the spec and the world size alone, so that every strategy meets the same schedule.

Nothing here touches a process: commbench.faults.fail_inject fires the events.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Union

from commbench.config.flags import accepting, flag
from commbench.config.sections import Section
from commbench.errors import UsageError

KINDS = ("kill", "stop", "cut")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_SECONDS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_EVENT = re.compile(r"(?P<rank>\d+)@(?:step(?P<step>\d+)|(?P<after>[\d.]+[a-z]+))"
                    r"(?::(?P<kind>[a-z]+))?(?:\+(?P<rejoin>[\d.]+[a-z]+))?")


@dataclass(frozen=True)
class FailEvent:
    """One failure: which rank, when (a step, or seconds of training), how, and after how
    many seconds it starts again (None: never)."""

    rank: int
    step: Optional[int] = None
    seconds: Optional[float] = None
    kind: str = "kill"
    rejoin: Optional[float] = None

    def __str__(self) -> str:
        when = f"step{self.step}" if self.step is not None else f"{self.seconds:g}s"
        rejoin = f"+{self.rejoin:g}s" if self.rejoin is not None else ""
        return f"{self.rank}@{when}:{self.kind}{rejoin}"

    def to_dict(self) -> Dict[str, Any]:
        """How the result records it."""
        return {"rank": self.rank, "step": self.step, "seconds": self.seconds,
                "kind": self.kind, "rejoin_seconds": self.rejoin}


@dataclass(frozen=True)
class RandomSchedule:
    """`mtbf=...,seed=...[,kind=...][,rejoin=...]`: failures drawn from a seed (expand)."""

    mtbf: float
    seed: int
    kind: str = "kill"
    rejoin: Optional[float] = None

    def __str__(self) -> str:
        kind = f",kind={self.kind}" if self.kind != "kill" else ""
        rejoin = f",rejoin={self.rejoin:g}s" if self.rejoin is not None else ""
        return f"mtbf={self.mtbf:g}s,seed={self.seed}{kind}{rejoin}"

    def expand(self, world_size: int) -> Tuple[FailEvent, ...]:
        """Every rank but 0 fails once, in a seeded order at seeded times (to the
        millisecond, as they are recorded), for good or until its rejoin."""
        draws = random.Random(self.seed)
        victims = list(range(1, world_size))
        draws.shuffle(victims)
        events, clock = [], 0.0
        for rank in victims:
            clock += draws.expovariate(1.0 / self.mtbf)
            events.append(FailEvent(rank, seconds=round(clock, 3), kind=self.kind,
                                    rejoin=self.rejoin))
        return tuple(events)


Spec = Union[Tuple[FailEvent, ...], RandomSchedule]


def seconds(text: str) -> float:
    """A positive duration: `45s`, `500ms`, `2m`, `1h`; ValueError otherwise."""
    found = _DURATION.fullmatch(text)
    if not found or float(found.group(1)) <= 0:
        raise ValueError(text)
    return float(found.group(1)) * _SECONDS[found.group(2)]


def parse(text: str) -> Optional[Spec]:
    """The events or the random schedule of a SPEC; None for `none`; ValueError for
    anything else."""
    text = text.strip()
    if text == "none":
        return None
    if "=" in text:
        return _random(text)
    return tuple(_event(part.strip()) for part in text.split(","))


def _random(text: str) -> RandomSchedule:
    given = dict(part.strip().partition("=")[::2] for part in text.split(","))
    if not {"mtbf", "seed"} <= set(given) <= {"mtbf", "seed", "kind", "rejoin"}:
        raise ValueError(text)
    kind = given.get("kind", "kill")
    if kind not in KINDS:
        raise ValueError(text)
    rejoin = seconds(given["rejoin"]) if "rejoin" in given else None
    return RandomSchedule(seconds(given["mtbf"]), int(given["seed"]), kind, rejoin)


def _event(text: str) -> FailEvent:
    found = _EVENT.fullmatch(text)
    if not found:
        raise ValueError(text)
    step = int(found.group("step")) if found.group("step") else None
    if step == 0 or (found.group("kind") or "kill") not in KINDS:
        raise ValueError(text)
    after = seconds(found.group("after")) if found.group("after") else None
    rejoin = seconds(found.group("rejoin")) if found.group("rejoin") else None
    return FailEvent(int(found.group("rank")), step, after, found.group("kind") or "kill",
                     rejoin)


@accepting("none, RANK@WHEN[:KIND][+REJOIN] events, comma-separated (WHEN: stepN or a "
           "duration such as 45s; KIND: kill, stop or cut; e.g. 1@step200 or 2@45s:stop), or "
           "mtbf=DURATION,seed=N[,kind=KIND][,rejoin=DURATION]")
def spec(text: str) -> str:
    """The flag's check: the SPEC written the one way results record it."""
    parsed = parse(text)
    if parsed is None:
        return "none"
    return str(parsed) if isinstance(parsed, RandomSchedule) else ",".join(map(str, parsed))


@dataclass(frozen=True)
class FailureFlags(Section):
    title = "failures on purpose"

    fail: str = flag(
        "none", "failures on purpose: ranks that kill (SIGKILL) or stop (SIGSTOP) themselves "
        "or, on an emulated cluster, cut their machine's link (cut) mid-run, "
        "RANK@WHEN[:KIND][+REJOIN] events (e.g. 1@step200, 2@45s:stop) or a seeded "
        "random schedule mtbf=60s,seed=1 (commbench.faults.fail_schedule); without a recovery "
        "policy a failure ends the job", spec, "SPEC")


def schedule(text: str, world_size: int) -> Tuple[FailEvent, ...]:
    """The events of a SPEC in a job of world_size ranks (none for `none`)."""
    parsed = parse(text)
    if parsed is None:
        return ()
    return parsed.expand(world_size) if isinstance(parsed, RandomSchedule) else parsed


def first_of_kind(text: str, kind: str) -> Optional[Union[FailEvent, RandomSchedule]]:
    """The first event of a SPEC of this kind, or its random schedule where that is of it
    (whatever the world size); None where there is none."""
    parsed = parse(text)
    if isinstance(parsed, RandomSchedule):
        return parsed if parsed.kind == kind else None
    return next((e for e in parsed or () if e.kind == kind), None)


def check(text: str, world_size: Optional[int], who: str = "this job",
          last_step: Optional[int] = None, restarts: bool = False,
          rejoins: bool = False) -> None:
    """UsageError for a schedule `who` cannot run (world size None: unknown), or with a
    step after last_step (None: not known before the run), which would never fire.
    Where the job restarts after a failure (--recovery restart), a rank may fail again
    and rejoin; where something starts a lost rank again (`commbench gossip`), it may
    rejoin, once."""
    parsed = parse(text)
    if parsed is None:
        return
    if isinstance(parsed, RandomSchedule):
        if world_size is not None and world_size < 2:
            raise UsageError("argument --fail: a random schedule fails every rank but rank 0, "
                             f"which writes the result; {who} has only rank 0")
        if parsed.rejoin is not None and not (restarts or rejoins):
            raise _nothing_to_rejoin(parsed, f"rejoin={parsed.rejoin:g}s")
        return
    rejoining = next((e for e in parsed if e.rejoin is not None
                      and not (restarts or rejoins)), None)
    if rejoining is not None:
        raise _nothing_to_rejoin(rejoining, f"+{rejoining.rejoin:g}s")
    late = next((e for e in parsed if last_step is not None and (e.step or 0) > last_step),
                None)
    if late is not None:
        raise UsageError(f"argument --fail: {late} comes after the run's last step "
                         f"({last_step}: warm-up and timed steps), so it would never fire")
    ranks = [e.rank for e in parsed]
    twice = next((r for r in ranks if ranks.count(r) > 1 and not restarts), None)
    if twice is not None:
        raise UsageError(f"argument --fail: rank {twice} fails twice; after its first failure "
                         "it is gone for good")
    if world_size is None:
        return
    missing = [r for r in ranks if r >= world_size]
    if missing:
        raise UsageError(f"argument --fail: rank {missing[0]} does not exist; {who} has ranks "
                         f"0 to {world_size - 1}")
    if len(set(ranks)) == world_size and not restarts:
        raise UsageError(f"argument --fail: the schedule fails every rank of {who} for good; "
                         "leave one to finish the run")


def _nothing_to_rejoin(what: Any, written: str) -> UsageError:
    return UsageError(f"argument --fail: {what} rejoins, but there is nothing to rejoin: "
                      f"without a recovery policy a failure ends the job; leave {written} "
                      "out, or restart the job (--recovery restart)")
