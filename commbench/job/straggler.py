"""Stragglers on purpose: `--slow-ranks R[,R...]:FACTOR[@P]`.

The named ranks compute FACTOR times slower. Before each compute phase of a step
(forward, backward, the optimizer's update) such a rank idles FACTOR - 1 times that
phase's compute time, measured on the rank itself before the run (alone, on a copy of
the model: commbench.job.compute_only.phase_medians), so the slowdown scales with the model
and the machine. It idles before a phase rather than after it so that every piece of
communication the phase posts leaves as late as a slower machine would post it: DDP
hands its last bucket over at the end of backward, a neighbor exchange its parameters
at the end of forward. With @P each step is slowed with probability P, as on a preempted
or noisy machine; the draws come from --seed and the rank, so a rerun slows the same
steps.

The idling is a phase of its own (spans of kind "injected"): the step split's "injected
delay", never compute, waiting or communication; the peers that wait for the slow rank
see it as waiting. The rank idles asleep: a slower machine elsewhere takes none of the
other ranks' cores, so neither does it here. On a GPU it first waits for the queued
work, so that it idles after the device's phase and not beside it. The compute-only
reference is not slowed: it is the machine's own speed, so efficiency shows what the
straggler costs.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Tuple

from commbench.errors import UsageError
from commbench.config.flags import accepting, flag
from commbench.config.sections import Section
from commbench.timing.spans import PHASES

if TYPE_CHECKING:  # pragma: no cover
    from commbench.timing.spans import Span

MAX_FACTOR = 1000.0  # beyond it a step would outlast any job's --timeout


@dataclass(frozen=True)
class SlowRanks:
    """Which ranks are slowed, by what factor, and with what probability per step."""

    ranks: Tuple[int, ...] = ()
    factor: float = 1.0
    probability: float = 1.0

    def __str__(self) -> str:
        if not self.ranks:
            return "none"
        text = f"{','.join(map(str, self.ranks))}:{self.factor:g}"
        return text if self.probability == 1.0 else f"{text}@{self.probability:g}"

    @property
    def on(self) -> bool:
        return bool(self.ranks)

    def describe(self) -> str:
        """How titles and the console name it: "rank 1 2x slower", "" when off."""
        if not self.ranks:
            return ""
        which = f"rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
        often = f" in {100 * self.probability:g}% of steps" if self.probability < 1 else ""
        return f"{which} {self.factor:g}x slower{often}"


def parse(text: str) -> SlowRanks:
    """A SlowRanks from its text ("none" or R[,R...]:FACTOR[@P]); ValueError otherwise."""
    text = text.strip()
    if text == "none":
        return SlowRanks()
    ranks_text, colon, rest = text.partition(":")
    if not colon:
        raise ValueError
    factor_text, at, probability_text = rest.partition("@")
    ranks = tuple(int(r) for r in ranks_text.split(","))
    factor = float(factor_text)
    probability = float(probability_text) if at else 1.0
    if (min(ranks) < 0 or len(set(ranks)) != len(ranks) or not 1.0 <= factor <= MAX_FACTOR
            or not 0.0 < probability <= 1.0):
        raise ValueError
    return SlowRanks(tuple(sorted(ranks)), factor, probability)


@accepting("none or RANKS:FACTOR[@P]: ranks from 0, each once, comma-separated; "
           f"1 < FACTOR <= {MAX_FACTOR:g} (1 slows nothing); 0 < P <= 1 (e.g. 1:2 or "
           "0,3:1.5@0.1)")
def spec(text: str) -> str:
    """The flag's check: the text written the one way results record it. A factor of 1
    is refused here, not in parse(): it would slow nothing while the run is labelled
    slowed, but results recorded with one still read back."""
    slow = parse(text)
    if slow.on and slow.factor == 1.0:
        raise ValueError
    return str(slow)


@dataclass(frozen=True)
class StragglerFlags(Section):
    title = "stragglers on purpose"

    slow_ranks: str = flag(
        "none", "stragglers on purpose: these ranks compute FACTOR times slower (before each "
        "compute phase they idle FACTOR - 1 times its measured time), each step or, with @P, "
        "with probability P; recorded, and its own part of the step split "
        "(commbench.job.straggler)", spec, "RANKS:FACTOR[@P]")


def check(text: str, world_size: Optional[int], who: str = "this job") -> None:
    """UsageError for a slowed rank that `who` does not have (world size None: unknown)."""
    slow = parse(text)
    missing = [r for r in slow.ranks if world_size is not None and r >= world_size]
    if missing:
        raise UsageError(f"argument --slow-ranks: rank {missing[0]} does not exist; {who} "
                         f"has ranks 0 to {world_size - 1}")


class Straggler:
    """This rank's slowdown: how long it idles before each phase of the step at hand."""

    def __init__(self, slow: SlowRanks, phase_seconds: Dict[str, float], seed: int, rank: int,
                 sync: Callable[[], None]):
        self.slow, self.phase_seconds, self.sync = slow, dict(phase_seconds), sync
        self.draws = random.Random(seed * 1_000_003 + rank)
        self.slowed_now = False

    def begin_step(self) -> None:
        """Draw whether the step now starting is slowed."""
        self.slowed_now = (self.slow.probability >= 1.0
                           or self.draws.random() < self.slow.probability)

    def seconds(self, phase: str) -> float:
        """How long to idle before this phase of the step at hand."""
        return self.delay(phase) if self.slowed_now else 0.0

    def delay(self, phase: str) -> float:
        """How long a slowed step idles before this phase."""
        return (self.slow.factor - 1.0) * self.phase_seconds.get(phase, 0.0)

    def idle(self, seconds: float) -> None:
        self.sync()
        time.sleep(seconds)

    def facts(self) -> Dict[str, float]:
        """What the result records of this rank's slowdown: its phases' measured seconds
        and the delay a slowed step gets."""
        return {**{f"{phase}_seconds": self.phase_seconds.get(phase, 0.0) for phase in PHASES},
                "delay_per_slowed_step": sum(self.delay(phase) for phase in PHASES)}


def summary(text: str, facts: Sequence[Optional[Dict[str, float]]],
            events: Sequence[Sequence["Span"]]) -> Optional[Dict[str, Any]]:
    """The result's summary.slow_ranks: what was asked (None: nothing), and for each slowed
    rank its measured phases, the delay of a slowed step, and how many of the recorded
    steps were slowed and for how long in all."""
    slow = parse(text)
    if not slow.on:
        return None
    per_rank = {}
    for rank in slow.ranks:
        mine = events[rank]
        injected = [span for span in mine if span.kind == "injected" and span.end is not None]
        per_rank[str(rank)] = {
            **(facts[rank] or {}),
            "recorded_steps": len({span.step for span in mine if span.kind == "step"}),
            "slowed_steps": len({span.step for span in injected}),
            "injected_seconds": sum(span.end - span.start for span in injected)}
    return {"ranks": list(slow.ranks), "factor": slow.factor,
            "probability": slow.probability, "per_rank": per_rank}
