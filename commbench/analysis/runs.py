"""The data model behind `report`, `plot` and `compare` (pure functions of the result
files; no torch): what a run of every kind holds (ResultRun), and speed runs, points
and groups; runs trained to accuracy extend ResultRun in commbench.analysis.accuracy.
Reading files into runs is commbench.analysis.reader's job, combining them
commbench.analysis.grouping's.

A *group* holds runs that may be drawn on one chart: same model, batch size per
worker, image size, classes, precision, device, backend, hardware and tag. Within
a group a *series* is one strategy with its topology settings, and a *point* is a
series at one worker count: repeated runs of it are combined, never shown twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from commbench.job import straggler
from commbench.job.language_models import LANGUAGE_MODELS
from commbench.result import metrics


class GroupKey(NamedTuple):
    """What must be equal for runs to be comparable on one chart."""

    model: str
    batch_size: int
    image_size: int  # pixels per side; a language model's tokens per sequence
    num_classes: int
    precision: str  # "fp32" or "amp-bf16"/"amp-fp16" (--amp), "+fp16-allreduce" when
    #                  communication is compressed ("fp16-allreduce" alone in fp32)
    device: str  # "cpu" or "cuda"
    backend: str
    network: str  # "" on real machines; the link rate (tc's spelling) on an emulated cluster
    stragglers: str  # "" without; else --slow-ranks as recorded ("1:2")
    hardware: str  # GPU name, else CPU name: runs from different machines never pool
    tag: str

    def title(self) -> str:
        lm = self.model in LANGUAGE_MODELS  # whose classes are its vocabulary: not shown
        parts = [self.model, f"batch {self.batch_size} per worker",
                 f"sequences of {self.image_size} tokens" if lm
                 else f"{self.image_size}x{self.image_size} images"]
        if self.num_classes != 1000 and not lm:
            parts.append(f"{self.num_classes} classes")
        parts += [self.precision, f"{self.device} ({self.hardware})", self.backend]
        return ", ".join(parts + given(self.network, self.stragglers, self.tag))

    def slug(self) -> str:
        lm = self.model in LANGUAGE_MODELS
        parts = [self.model, f"bs{self.batch_size}", f"{self.image_size}{'tok' if lm else 'px'}"]
        if self.num_classes != 1000 and not lm:
            parts.append(f"{self.num_classes}cls")
        return slug_of(self, parts)

    def matching(self) -> Tuple:
        return matching(self)


def slug_of(key, parts: List[str]) -> str:
    """A group key's name in file names: its own parts, then where it ran (every kind's
    key ends in precision, device, backend, network, stragglers, hardware and tag)."""
    parts = parts + [key.precision, key.device, key.backend]
    if key.network:
        parts.append(f"emulated-{key.network}")
    if key.stragglers:
        parts.append("slow-" + key.stragglers.replace(":", "x").replace(",", "+")
                     .replace("@", "p"))
    if key.tag:
        parts.append(key.tag)
    return "-".join(parts)


def matching(key) -> Tuple:
    """The part of a group key `compare` matches on: arms may differ in hardware and tag,
    the last two fields of every kind's key."""
    return tuple(key)[:-2]


class Series(NamedTuple):
    """A strategy as configured: decentralized ones differ by topology settings."""

    strategy: str
    topology: str = ""  # "" for strategies without a topology
    schedule: str = ""  # "dynamic" or "static"
    style: str = ""  # "AWC" or "ATC"
    machines: str = ""  # "<m> ranks/machine" when --machine-size set the layout
    variant: str = ""  # a plugin option that changes what runs (e.g. "Adasum")

    def settings(self) -> str:
        return ", ".join(p for p in self[1:] if p)

    def label(self) -> str:
        settings = self.settings()
        return f"{self.strategy} ({settings})" if settings else self.strategy

    def order(self) -> Tuple:
        # the compute-only `none` last: it is the reference, not a contender
        return (self.strategy == "none", bool(self.topology), self)


@dataclass(frozen=True)
class ResultRun:
    """What a run of every kind read from its result file holds: the file, the key of
    the group it belongs to, its strategy as configured and its worker count."""

    path: Path
    doc: Dict[str, Any] = field(repr=False)
    key: Any  # GroupKey for a speed run, AccuracyKey for one trained to accuracy
    series: Series
    workers: int

    @property
    def match_key(self) -> Tuple:
        """What `compare` pairs runs on: the key without hardware and tag, the series
        and the worker count."""
        return (self.key.matching(), self.series, self.workers)

    @property
    def wire_unrecorded(self) -> bool:
        """Its strategy communicated but counted no byte on the wire (commbench.result.record)."""
        return bool(self.doc["summary"].get("wire_unrecorded"))


@dataclass(frozen=True)
class Run(ResultRun):
    """The numbers of one speed result that the analysis uses."""

    total: float  # mean of S_i
    total_ci: Optional[float]  # 95% CI of that mean over the iterations
    totals: Tuple[float, ...]  # S_i, per iteration
    batch_seconds: Tuple[float, ...]  # pooled over ranks and iterations
    latency: Dict[str, float]
    compute_only: Optional[float]  # img/sec per worker, measured in the same job
    efficiency_in_job: Optional[float]
    efficiency_in_job_ci: Optional[float]
    overhead: Optional[float]
    overhead_ci: Optional[float]
    consensus: Tuple[float, ...]  # per iteration; () for global strategies
    final_consensus: Optional[float]
    oversubscribed: bool  # more workers on a machine than physical cores
    flags: Tuple[str, ...]  # metrics.trust_flags of its summary
    # where its loss first went non-finite ({"step", "rank"}), None when it never did:
    # its img/sec stand, its loss and consensus distance are NaN or infinite
    diverged: Optional[Dict[str, int]] = None


@dataclass
class Point:
    """A series at one worker count: its runs combined."""

    series: Series
    workers: int
    runs: List[Run]
    total: float
    ci: Optional[float]
    ci_over: str  # "iterations" (one run) or "runs" (repeats)
    totals: np.ndarray  # S_i of all runs
    latency: Dict[str, float]
    compute_only: Optional[float]
    efficiency_in_job: Optional[float]
    efficiency_in_job_ci: Optional[float]
    overhead: Optional[float]
    overhead_ci: Optional[float]
    final_consensus: Optional[float]
    consensus: np.ndarray  # mean over runs per iteration
    oversubscribed: bool
    efficiency: Optional[float] = None  # E(N), set when a Total(1) applies (Baseline)
    efficiency_ci: Optional[float] = None

    @property
    def per_worker(self) -> float:
        return self.total / self.workers

    @property
    def split(self) -> Optional[Dict[str, float]]:
        """The mean step split of the point's runs (mean_split)."""
        return mean_split(self.runs)

    @property
    def sent(self) -> Optional[Dict[str, float]]:
        """What each worker of the point's runs put on the wire (mean_wire)."""
        return mean_wire(self.runs)

    @property
    def flags(self) -> List[str]:
        """What not to trust about this point (metrics.FLAGS codes), judged on its
        combined numbers (a repeat can settle what one run could not)."""
        summary = {"total_img_sec": {"mean": self.total, "ci95": self.ci},
                   "efficiency_in_job": self.efficiency_in_job,
                   "communication_overhead": self.overhead,
                   "oversubscribed": self.oversubscribed}
        found = metrics.trust_flags(summary, self.efficiency)
        late = any("reference" in r.flags for r in self.runs)
        return found + ["reference"] * late + ["diverged"] * bool(self.diverged)

    @property
    def diverged(self) -> List[Run]:
        """The point's runs whose loss went non-finite."""
        return [r for r in self.runs if r.diverged]


def mean_split(runs: Sequence[ResultRun]) -> Optional[Dict[str, float]]:
    """The mean step split of runs (seconds per step of each part they all recorded), or
    None when a run recorded none (older files, engines that time their own steps)."""
    splits = [run.doc["summary"].get("step_split") for run in runs]
    if not splits or any(split is None for split in splits):
        return None
    return {part: sum(split[part]["mean"] for split in splits) / len(splits)
            for part in splits[0] if all(part in split for split in splits)}


def mean_wire(runs: Sequence[ResultRun]) -> Optional[Dict[str, Optional[float]]]:
    """What each worker put on the wire (summary.wire's bytes and messages per step,
    bytes per image), mean over runs; None when a run recorded none (older files,
    engines that communicate out of sight)."""
    found = [run.doc["summary"].get("wire") for run in runs]
    if not found or any(sent is None for sent in found):
        return None
    return {key: None if any(sent.get(key) is None for sent in found)
            else sum(sent[key] for sent in found) / len(found)
            for key in ("bytes_per_step", "messages_per_step", "bytes_per_image")}


@dataclass(frozen=True)
class Baseline:
    """Total(1) of a series: the same strategy's 1-worker runs, which do what the
    series does minus the communication, so E(N) measures what communication and
    scaling cost; for a strategy without one, the compute-only `none`'s."""

    total: float
    ci: Optional[float]
    runs: int
    source: Series


@dataclass
class Group:
    key: GroupKey
    points: List[Point]
    baselines: Dict[Series, Baseline]  # the Total(1) each series' E(N) is measured against

    @property
    def baseline(self) -> Optional[Baseline]:
        """The Total(1) of the ideal line: the compute-only `none`'s, else the first
        series' own."""
        own = [b for s, b in self.baselines.items() if b.source == s]
        ordered = sorted(own, key=lambda b: (b.source.strategy != "none", b.source.order()))
        return ordered[0] if ordered else None

    @property
    def series(self) -> List[Series]:
        return sorted({p.series for p in self.points}, key=Series.order)

    @property
    def has_split(self) -> bool:
        return any(p.split is not None for p in self.points)

    @property
    def workers(self) -> List[int]:
        return sorted({p.workers for p in self.points})

    def ideal(self) -> Tuple[Dict[int, float], str]:
        """Linear scaling per worker count, and what it is measured from.

        From Total(1) when a 1-worker run exists; otherwise N times the in-job
        compute-only rate at N (which is what E* compares against)."""
        if self.baseline is not None:
            return ({n: n * self.baseline.total for n in self.workers},
                    f"N × {self.baseline.source.strategy} 1-worker throughput")
        ideal = {}
        for n in self.workers:
            rates = [r.compute_only for p in self.points if p.workers == n for r in p.runs
                     if r.compute_only is not None]
            if rates:
                ideal[n] = n * float(np.mean(rates))
        return ideal, "N × in-job compute-only rate"


def emulated(link: str) -> str:
    """How titles name an emulated network."""
    return f"emulated, {link} links network"


def slowed(stragglers: str) -> str:
    """How titles name the stragglers a run was given on purpose (--slow-ranks)."""
    return f"{straggler.parse(stragglers).describe()} (on purpose)"


def given(network: Optional[str], stragglers: Optional[str],
          tag: Optional[str] = None) -> List[str]:
    """How titles name what runs were given beyond their workload and machine: an
    emulated network, stragglers on purpose, a tag (each where there is one)."""
    return (([emulated(network)] if network else [])
            + ([slowed(stragglers)] if stragglers else []) + ([f"tag {tag}"] if tag else []))
