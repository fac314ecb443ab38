"""Runs trained to accuracy as `report`, `plot` and `compare` hold them: a run, the
group of runs that may be set side by side, and a row (one strategy at one worker count,
its repeats combined by commbench.analysis.time_to_target). Pure functions; no torch.
Reading and checking the result files is commbench.analysis.accuracy_reading's.

A group holds runs of one task and one training recipe on one kind of machine: model,
data, partition, batch size, image size, target, evaluation interval, budget, SGD's
settings, precision, device, backend, network, hardware and tag. The seed is left out:
repeats of a configuration differ in it (`commbench sweep --repeat`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple

from commbench.analysis import time_to_target as ttt
from commbench.faults import fail_schedule
from commbench.analysis.runs import (ResultRun, Series, given, matching, mean_split, mean_wire,
                                     slug_of)


class AccuracyKey(NamedTuple):
    """What must be equal for runs trained to accuracy to be compared."""

    model: str
    data: str  # the task as the run described it, e.g. learnable:classes=10,noise=2,samples=320
    partition: str
    batch_size: int
    image_size: int
    target: str  # the target accuracy as given ("0.8"), a target loss's "loss 2.5"; "" if none
    eval_every: int
    budget: str  # what bounds a run that does not reach the target
    training: str  # the optimizer's settings
    precision: str
    device: str
    backend: str
    network: str
    stragglers: str
    hardware: str
    tag: str

    def title(self) -> str:
        return f"{self.heading()}; {self.details()}"

    def heading(self) -> str:
        """The task: what was learnt, by which model, to which target."""
        target = f"target {self.target}" if self.target else "no target"
        # a language model's runs keep their sequence length where an image model's
        # keep their image size
        shape = f"sequences of {self.image_size} tokens" if self.by_loss else \
            f"{self.image_size}x{self.image_size} images"
        return (f"{self.model}, {self.data}, partition {self.partition}, batch "
                f"{self.batch_size} per worker, {shape}, {target}")

    @property
    def by_loss(self) -> bool:
        """Whether these are a language model's runs, whose target is a loss."""
        return self.data.startswith("language:")

    def details(self) -> str:
        """How it was trained and measured, and where."""
        parts = [f"evaluated every {self.eval_every} steps", f"budget {self.budget}",
                 self.training, self.precision,
                 f"{self.device} ({self.hardware}), {self.backend}"]
        return "; ".join(parts + given(self.network, self.stragglers, self.tag))

    def slug(self) -> str:
        data = self.data.replace("learnable:", "").replace("samples=", "s").replace(
            "classes=", "c").replace("noise=", "noise")
        return slug_of(self, [self.model, data, self.partition, f"bs{self.batch_size}",
                              f"{self.image_size}{'tok' if self.by_loss else 'px'}",
                              f"target{self.target}" if self.target else "notarget"])

    def matching(self) -> Tuple:
        return matching(self)


@dataclass(frozen=True)
class AccuracyRun(ResultRun):
    """The numbers of one accuracy result that the analysis uses. Everything "to
    target" is None when the run did not reach it (or had no target)."""

    seed: Optional[int]
    reached: Optional[bool]  # None: no target was given
    time: Optional[float]  # training seconds to the target (evaluation paused)
    # wall seconds to the target (evaluation included; a recovery policy's from the
    # job's start, failures included)
    wall_time: Optional[float]
    steps: Optional[int]
    epochs: Optional[float]
    sent: Optional[float]  # bytes each worker put on the wire to the target
    best_accuracy: float
    stopped_by: str
    img_sec: Optional[float]  # all workers, during training
    curve: Tuple[Dict[str, float], ...]
    oversubscribed: bool
    # where its loss first went non-finite ({"step", "rank"}), None when it never did
    diverged: Optional[Dict[str, int]] = None
    # a language model's lowest validation loss of the averaged model; None for images
    best_loss: Optional[float] = None
    # --recovery restart's facts (goodput, restarts, each failure's costs); None without
    recovery: Optional[Dict[str, Any]] = None

    @property
    def failures(self) -> str:
        """The --fail schedule and --recovery policy it ran under, as given ("" for a run
        with neither): runs under different ones did not face the same failures."""
        config = self.doc["config"]
        fail, policy = str(config.get("fail") or "none"), str(config.get("recovery") or "none")
        return "" if fail == policy == "none" else f"--fail {fail} --recovery {policy}"

    @property
    def policy(self) -> str:
        return str(self.doc["config"].get("recovery") or "none")

    @property
    def rejoin(self) -> Optional[float]:
        """Seconds after which its random schedule's failed ranks start again (None: never,
        or no random schedule)."""
        try:
            spec = fail_schedule.parse(str(self.doc["config"].get("fail") or "none"))
        except ValueError:
            return None
        return spec.rejoin if isinstance(spec, fail_schedule.RandomSchedule) else None

    @property
    def failures_per_hour(self) -> Optional[float]:
        """The rate of its --fail schedule: 0 without one, 3600 / MTBF for a random
        schedule, None for explicit events (a count, not a rate)."""
        try:
            spec = fail_schedule.parse(str(self.doc["config"].get("fail") or "none"))
        except ValueError:  # written by another version: no rate to read
            return None
        if spec is None:
            return 0.0
        return 3600.0 / spec.mtbf if isinstance(spec, fail_schedule.RandomSchedule) else None


@dataclass
class AccuracyRow:
    """One strategy at one worker count: its repeated runs combined."""

    series: Series
    workers: int
    runs: List[AccuracyRun]

    @property
    def has_target(self) -> bool:
        return self.runs[0].reached is not None

    @property
    def reached(self) -> int:
        return sum(bool(r.reached) for r in self.runs)

    def times(self, wall: bool = False) -> List[Optional[float]]:
        return [r.wall_time if wall else r.time for r in self.runs]

    def combined(self, wall: bool = False) -> Optional[ttt.Combined]:
        return ttt.combine(self.times(wall)) if self.has_target else None

    def median_of(self, name: str) -> Optional[float]:
        return ttt.median([getattr(r, name) for r in self.runs]) if self.has_target else None

    @property
    def best_missed(self) -> Optional[float]:
        """The best accuracy among runs that did not reach the target."""
        missed = [r.best_accuracy for r in self.runs if not r.reached]
        return max(missed) if missed else None

    @property
    def best_loss_missed(self) -> Optional[float]:
        """A language model's: the lowest loss among runs that did not reach the target."""
        missed = [r.best_loss for r in self.runs if not r.reached and r.best_loss is not None]
        return min(missed) if missed else None

    @property
    def img_sec(self) -> Optional[float]:
        known = [r.img_sec for r in self.runs if r.img_sec is not None]
        return sum(known) / len(known) if known else None

    @property
    def goodput(self) -> Optional[float]:
        """The median goodput of its runs that recorded one (a recovery policy's: useful
        samples per second of wall time, failures included); None where none did."""
        return ttt.median([r.recovery["goodput"] for r in self.runs if r.recovery])

    def median_cost(self, name: str) -> Optional[float]:
        """The median over its runs' failures of a cost each recorded (`recovery_seconds`:
        to the first complete step after it; `rejoin_seconds`: until the worker trained
        with the others again); None where no failure recorded it."""
        return ttt.median([c[name] for r in self.runs if r.recovery
                           for c in r.recovery.get("costs", ()) if c.get(name) is not None])

    @property
    def failures(self) -> str:
        """Its runs' --fail schedule and recovery policy (AccuracyRun.failures), "" for
        runs with neither; a report's rows never mix them (group()), a compared cell's
        runs may: then several, joined by " | "."""
        found = sorted({r.failures or "no --fail" for r in self.runs})
        return "" if found == ["no --fail"] else " | ".join(found)

    @property
    def cell(self) -> Tuple[Series, int, str]:
        """What sets the row apart in its group: strategy, workers and failures."""
        return (self.series, self.workers, self.failures)

    @property
    def split(self) -> Optional[Dict[str, float]]:
        """Where the steps of the row's runs went, mean over them (runs.mean_split)."""
        return mean_split(self.runs)

    @property
    def wire(self) -> Optional[Dict[str, Optional[float]]]:
        """What each worker sent per step and per image, mean over the runs."""
        return mean_wire(self.runs)

    @property
    def flags(self) -> List[str]:
        """What not to trust about the row: runs that share a seed (their spread is the
        machine's, not the training's), CPU workers sharing cores, and a run whose loss
        went non-finite (as the speed table flags it)."""
        found = []
        if len({r.seed for r in self.runs}) < len(self.runs):
            found.append("same-seed")
        if any(r.oversubscribed for r in self.runs):
            found.append("oversubscribed")
        if any(r.diverged is not None for r in self.runs):
            found.append("diverged")
        return found

    def representative(self) -> AccuracyRun:
        """The run of median time to target (a missed run counting as slowest, the
        better accuracy first among those), drawn bold in the charts."""
        ranked = sorted(self.runs, key=lambda r: (ttt.NEVER if r.time is None else r.time,
                                                  -r.best_accuracy, str(r.path)))
        return ranked[(len(ranked) - 1) // 2]


@dataclass
class AccuracyGroup:
    key: AccuracyKey
    rows: List[AccuracyRow]


def group(runs: Iterable[AccuracyRun]) -> List[AccuracyGroup]:
    """Runs -> groups (sorted), each with a row per (strategy, workers, failures): runs
    under another failure schedule or recovery policy are not repeats of one another."""
    by_key: Dict[AccuracyKey, Dict[Tuple[Series, int, str], List[AccuracyRun]]] = {}
    for run in runs:
        by_key.setdefault(run.key, {}).setdefault(
            (run.series, run.workers, run.failures), []).append(run)
    return [AccuracyGroup(key, [AccuracyRow(c[0], c[1], sorted(cells[c], key=_run_order))
                                for c in sorted(cells, key=lambda c: (c[0].order(), *c[1:]))])
            for key, cells in sorted(by_key.items())]


def rows_by_match(runs: Iterable[AccuracyRun]) -> Dict[Tuple, AccuracyRow]:
    """`compare`'s cells: rows keyed by configuration, hardware and tag left out."""
    cells: Dict[Tuple, List[AccuracyRun]] = {}
    for run in runs:
        cells.setdefault(run.match_key, []).append(run)
    return {k: AccuracyRow(v[0].series, v[0].workers, sorted(v, key=_run_order))
            for k, v in cells.items()}


def _run_order(run: AccuracyRun) -> Tuple:
    return (run.seed if run.seed is not None else -math.inf, str(run.path))
