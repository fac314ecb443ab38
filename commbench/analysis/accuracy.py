"""Results of runs trained to accuracy (kind "accuracy", commbench.convergence) as
`report`, `plot` and `compare` read them: a run, the group of runs that may be set
side by side, and a row (one strategy at one worker count, its repeats combined by
commbench.analysis.time_to_target). Pure functions of the files; no torch.

A group holds runs of one task and one training recipe on one kind of machine: model,
data, partition, batch size, image size, target, evaluation interval, budget, SGD's
settings, precision, device, backend, network, hardware and tag. The seed is left out:
repeats of a configuration differ in it (`commbench sweep --repeat`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

from commbench.analysis import time_to_target as ttt
from commbench.analysis import validate
from commbench.analysis.reading import network_of, precision_of, series_of
from commbench.analysis.runs import Series, emulated
from commbench.analysis.validate import MAYBE as _MAYBE
from commbench.analysis.validate import items, number, section, text, whole
from commbench.config import MAX_EPOCHS
from commbench.results import load_results

KIND = "accuracy"

# What read computes with. A diverged run's curve holds NaN or infinite losses and
# consensus distances (shown as such); its accuracies, times and counts are numbers.
FIELDS = (
    text("config.model"), whole("config.batch_size", 1), whole("config.image_size", 1),
    number("config.target_accuracy", 0, 1, above=True, **_MAYBE),
    whole("config.eval_every", 1, optional=True), whole("summary.eval_every", 1, **_MAYBE),
    number("config.lr", **_MAYBE), number("config.momentum"),
    number("config.weight_decay", **_MAYBE), number("config.warmup_epochs", 0, **_MAYBE),
    number("config.max_epochs", 0, above=True, **_MAYBE),
    number("config.time_budget", 0, above=True, **_MAYBE), whole("config.seed", **_MAYBE),
    section("data", **_MAYBE), section("recipe", **_MAYBE),
    number("recipe.weight_decay", **_MAYBE),
    section("environment"), whole("environment.world_size", 1),
    validate.flag("summary.reached", **_MAYBE), number("summary.best_accuracy", 0, 1),
    text("summary.stopped_by"), number("summary.img_sec", 0, above=True, **_MAYBE),
    validate.flag("summary.oversubscribed", **_MAYBE),
    section("summary.diverged", **_MAYBE), whole("summary.diverged.step", 1),
    whole("summary.diverged.rank", 0),
    items("curve"), section("curve.*"), whole("curve.*.step", 0),
    number("curve.*.epoch", 0), number("curve.*.training_seconds", 0),
    number("curve.*.wall_seconds", 0), number("curve.*.accuracy", 0, 1),
    number("curve.*.worker_mean", 0, 1), number("curve.*.worker_worst", 0, 1),
    number("curve.*.loss", finite=False, **_MAYBE),
    number("curve.*.consensus_distance", finite=False, **_MAYBE),
)
# Besides, of a run that reached its target (time_to_target is checked in read, in words
# of its own).
REACHED_FIELDS = (
    number("summary.wall_time_to_target", 0, above=True, **_MAYBE),
    whole("summary.steps_to_target", 0, **_MAYBE),
    number("summary.epochs_to_target", 0, **_MAYBE),
)


class AccuracyKey(NamedTuple):
    """What must be equal for runs trained to accuracy to be compared."""

    model: str
    data: str  # the task as the run described it, e.g. learnable:classes=10,noise=2,samples=320
    partition: str
    batch_size: int
    image_size: int
    target: str  # the target accuracy as given ("0.8"); "" when the run had none
    eval_every: int
    budget: str  # what bounds a run that does not reach the target
    training: str  # the optimizer's settings
    precision: str
    device: str
    backend: str
    network: str
    hardware: str
    tag: str

    def title(self) -> str:
        return f"{self.heading()}; {self.details()}"

    def heading(self) -> str:
        """The task: what was learnt, by which model, to which target."""
        target = f"target {self.target}" if self.target else "no target"
        return (f"{self.model}, {self.data}, partition {self.partition}, batch "
                f"{self.batch_size} per worker, {self.image_size}x{self.image_size} images, "
                f"{target}")

    def details(self) -> str:
        """How it was trained and measured, and where."""
        parts = [f"evaluated every {self.eval_every} steps", f"budget {self.budget}",
                 self.training, self.precision,
                 f"{self.device} ({self.hardware}), {self.backend}"]
        if self.network:
            parts.append(emulated(self.network))
        if self.tag:
            parts.append(f"tag {self.tag}")
        return "; ".join(parts)

    def slug(self) -> str:
        data = self.data.replace("learnable:", "").replace("samples=", "s").replace(
            "classes=", "c").replace("noise=", "noise")
        parts = [self.model, data, self.partition, f"bs{self.batch_size}",
                 f"{self.image_size}px", f"target{self.target}" if self.target else "notarget",
                 self.precision, self.device, self.backend]
        if self.network:
            parts.append(f"emulated-{self.network}")
        if self.tag:
            parts.append(self.tag)
        return "-".join(parts)

    def matching(self) -> Tuple:
        """The part `compare` matches on: arms may differ in hardware and tag."""
        return tuple(self)[:13]


@dataclass(frozen=True)
class AccuracyRun:
    """The numbers of one accuracy result that the analysis uses. Everything "to
    target" is None when the run did not reach it (or had no target)."""

    path: Path
    doc: Dict[str, Any] = field(repr=False)
    key: AccuracyKey
    series: Series
    workers: int
    seed: Optional[int]
    reached: Optional[bool]  # None: no target was given
    time: Optional[float]  # training seconds to the target (evaluation paused)
    wall_time: Optional[float]  # wall seconds to the target (evaluation included)
    steps: Optional[int]
    epochs: Optional[float]
    best_accuracy: float
    stopped_by: str
    img_sec: Optional[float]  # all workers, during training
    curve: Tuple[Dict[str, float], ...]
    oversubscribed: bool
    # where its loss first went non-finite ({"step", "rank"}), None when it never did
    diverged: Optional[Dict[str, int]] = None

    @property
    def match_key(self) -> Tuple:
        return (self.key.matching(), self.series, self.workers)


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
    def img_sec(self) -> Optional[float]:
        known = [r.img_sec for r in self.runs if r.img_sec is not None]
        return sum(known) / len(known) if known else None

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


def load(paths: Iterable[Union[str, Path]]) -> Tuple[List[AccuracyRun], List[str]]:
    """Every usable accuracy result under paths, and one line per such file skipped
    (files of other kinds, or not results at all, are the run readers' to report)."""
    found, _ = load_results(paths)
    return validate.usable([r for r in found if r.kind == KIND], KIND, (),
                           lambda result: read(result.path, result.doc))


def read(path: Path, doc: Dict[str, Any]) -> AccuracyRun:
    """The run of an accuracy result; validate.Invalid names the field it cannot use."""
    validate.check(doc, FIELDS)
    config, summary = doc["config"], doc["summary"]
    env = doc.get("environment") or {}
    device = str(env.get("device") or ("cpu" if config.get("no_cuda") else "unknown"))
    hardware = env.get("gpu") if device == "cuda" else env.get("cpu")
    target = config.get("target_accuracy")
    data = (doc.get("data") or {}).get("data") or config["data"]
    key = AccuracyKey(str(config["model"]), str(data), str(config.get("partition") or "iid"),
                      int(config["batch_size"]), int(config["image_size"]),
                      "" if target is None else f"{float(target):g}",
                      int(summary.get("eval_every") or config["eval_every"]), budget_of(config),
                      training_of(doc), precision_of(config), device,
                      str(env.get("backend") or "unknown"), network_of(env),
                      str(hardware or "unknown"), str(config.get("tag") or ""))
    reached = None if target is None else summary["reached"] is True
    if reached and not _positive(summary.get("time_to_target")):
        raise validate.Invalid("summary.time_to_target", f"is "
                               f"{validate.shown(summary.get('time_to_target'))}: it reached "
                               "the target but records no time to it")
    if reached:
        validate.check(doc, REACHED_FIELDS)

    def to_target(name: str, kind=float):
        # never a number for a run that did not reach the target, whatever the file says
        value = summary.get(name) if reached else None
        return None if value is None else kind(value)

    curve = tuple({k: float(p[k]) for k in CURVE_FIELDS} for p in doc["curve"])
    if not curve:
        raise ValueError("its curve is empty")
    workers = int(env["world_size"])
    seed = config.get("seed")
    return AccuracyRun(
        path=Path(path), doc=doc, key=key, series=series_of(doc), workers=workers,
        seed=None if seed is None else int(seed), reached=reached,
        time=to_target("time_to_target"), wall_time=to_target("wall_time_to_target"),
        steps=to_target("steps_to_target", int), epochs=to_target("epochs_to_target"),
        best_accuracy=float(summary["best_accuracy"]), stopped_by=str(summary["stopped_by"]),
        img_sec=_float(summary.get("img_sec")), curve=curve,
        oversubscribed=bool(summary.get("oversubscribed")), diverged=diverged_of(summary))


def diverged_of(summary: Dict[str, Any]) -> Optional[Dict[str, int]]:
    """Where the run diverged; {} for one that stopped as diverged without saying where."""
    if summary.get("diverged"):
        return dict(summary["diverged"])
    return {} if summary.get("stopped_by") == "diverged" else None


CURVE_FIELDS = ("step", "epoch", "training_seconds", "wall_seconds", "accuracy",
                "worker_mean", "worker_worst")


def training_of(doc: Dict[str, Any]) -> str:
    """The optimizer's settings, as rules rather than values where a value follows the
    worker count (the peak learning rate scaled with the total batch), so that one
    recipe at several worker counts stays one group."""
    config, recipe = doc["config"], doc.get("recipe") or {}
    if config.get("lr") is not None:
        lr = f"lr {float(config['lr']):g}"
    else:  # "linear scaling: 0.1 x 64/256": the rule, without this run's batch
        lr = "lr " + (str(recipe.get("lr_rule") or "default").split(":")[0])
    parts = [f"SGD {lr}", f"momentum {float(config['momentum']):g}"]
    decay = recipe.get("weight_decay", config.get("weight_decay"))
    if decay is not None:
        parts.append(f"weight decay {float(decay):g}")
    schedule, warmup = recipe.get("schedule"), config.get("warmup_epochs")
    if schedule and schedule != "constant":
        parts.append(f"warm-up over {warmup:g} epoch{'' if warmup == 1 else 's'}, then "
                     "cosine decay" if "cosine" in schedule and warmup is not None
                     else str(schedule))
    if config.get("independent_init"):
        parts.append("independent init")
    return ", ".join(parts)


def budget_of(config: Dict[str, Any]) -> str:
    """What ends a run that misses the target, in the run's own terms."""
    epochs, seconds = config.get("max_epochs"), config.get("time_budget")
    if epochs is None and seconds is None:
        epochs = MAX_EPOCHS
    parts = ([f"{float(epochs):g} epochs"] if epochs is not None else []) + \
        ([f"{float(seconds):g} s"] if seconds is not None else [])
    return " or ".join(parts)


def group(runs: Iterable[AccuracyRun]) -> List[AccuracyGroup]:
    """Runs -> groups (sorted), each with a row per (strategy, workers)."""
    by_key: Dict[AccuracyKey, Dict[Tuple[Series, int], List[AccuracyRun]]] = {}
    for run in runs:
        by_key.setdefault(run.key, {}).setdefault((run.series, run.workers), []).append(run)
    return [AccuracyGroup(key, [AccuracyRow(s, n, sorted(cells[(s, n)], key=_run_order))
                                for s, n in sorted(cells, key=lambda c: (c[0].order(), c[1]))])
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


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _float(value) -> Optional[float]:
    return None if value is None else float(value)
