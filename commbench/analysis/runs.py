"""From result files to comparable groups of combined runs: the one data model
behind `report`, `plot` and `compare` (pure functions of the files; no torch).

A *group* holds runs that may be drawn on one chart: same model, batch size per
worker, image size, classes, precision, device, backend, hardware and tag. Within
a group a *series* is one strategy with its topology settings, and a *point* is a
series at one worker count: repeated runs of it are combined, never shown twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

import numpy as np

from commbench import metrics
from commbench.results import load_results


class GroupKey(NamedTuple):
    """What must be equal for runs to be comparable on one chart."""

    model: str
    batch_size: int
    image_size: int
    num_classes: int
    precision: str  # "fp32" or "amp-bf16"/"amp-fp16" (--amp), "+fp16-allreduce" when
    #                  communication is compressed ("fp16-allreduce" alone in fp32)
    device: str  # "cpu" or "cuda"
    backend: str
    hardware: str  # GPU name, else CPU name: runs from different machines never pool
    tag: str

    def title(self) -> str:
        parts = [self.model, f"batch {self.batch_size} per worker",
                 f"{self.image_size}x{self.image_size} images"]
        if self.num_classes != 1000:
            parts.append(f"{self.num_classes} classes")
        parts += [self.precision, f"{self.device} ({self.hardware})", self.backend]
        if self.tag:
            parts.append(f"tag {self.tag}")
        return ", ".join(parts)

    def slug(self) -> str:
        parts = [self.model, f"bs{self.batch_size}", f"{self.image_size}px"]
        if self.num_classes != 1000:
            parts.append(f"{self.num_classes}cls")
        parts += [self.precision, self.device, self.backend]
        if self.tag:
            parts.append(self.tag)
        return "-".join(parts)

    def matching(self) -> Tuple:
        """The part `compare` matches on: arms may differ in hardware and tag."""
        return tuple(self)[:7]


class Series(NamedTuple):
    """A strategy as configured: decentralized ones differ by topology settings."""

    strategy: str
    topology: str = ""  # "" for strategies without a topology
    schedule: str = ""  # "dynamic" or "static"
    style: str = ""  # "AWC" or "ATC"
    machines: str = ""  # "<m> ranks/machine" when --machine-size set the layout

    def settings(self) -> str:
        return ", ".join(p for p in self[1:] if p)

    def label(self) -> str:
        settings = self.settings()
        return f"{self.strategy} ({settings})" if settings else self.strategy

    def order(self) -> Tuple:
        # the compute-only `none` last: it is the reference, not a contender
        return (self.strategy == "none", bool(self.topology), self)


@dataclass(frozen=True)
class Run:
    """The numbers of one result file that the analysis uses."""

    path: Path
    doc: Dict[str, Any] = field(repr=False)
    key: GroupKey
    series: Series
    workers: int
    total: float  # mean of S_i
    total_ci: Optional[float]  # 95% CI of that mean over the iterations
    totals: Tuple[float, ...]  # S_i, per iteration
    batch_seconds: Tuple[float, ...]  # pooled over ranks and iterations
    latency: Dict[str, float]
    compute_only: Optional[float]  # img/sec per worker, measured in the same job
    efficiency_in_job: Optional[float]
    overhead: Optional[float]
    consensus: Tuple[float, ...]  # per iteration; () for global strategies
    final_consensus: Optional[float]

    @property
    def match_key(self) -> Tuple:
        return (self.key.matching(), self.series, self.workers)


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
    overhead: Optional[float]
    final_consensus: Optional[float]
    consensus: np.ndarray  # mean over runs per iteration
    efficiency: Optional[float] = None  # E(N), set when the group has a 1-worker baseline

    @property
    def per_worker(self) -> float:
        return self.total / self.workers


@dataclass
class Group:
    key: GroupKey
    points: List[Point]
    baseline: Optional[float]  # Total(1): mean of the group's 1-worker runs
    baseline_runs: int

    @property
    def series(self) -> List[Series]:
        return sorted({p.series for p in self.points}, key=Series.order)

    @property
    def workers(self) -> List[int]:
        return sorted({p.workers for p in self.points})

    def ideal(self) -> Tuple[Dict[int, float], str]:
        """Linear scaling per worker count, and what it is measured from.

        From Total(1) when a 1-worker run exists; otherwise N times the in-job
        compute-only rate at N (which is what E* compares against)."""
        if self.baseline is not None:
            return {n: n * self.baseline for n in self.workers}, "N × 1-worker throughput"
        ideal = {}
        for n in self.workers:
            rates = [r.compute_only for p in self.points if p.workers == n for r in p.runs
                     if r.compute_only is not None]
            if rates:
                ideal[n] = n * float(np.mean(rates))
        return ideal, "N × in-job compute-only rate"


def load_runs(paths: Iterable[Union[str, Path]],
              handled: Tuple[str, ...] = ()) -> Tuple[List[Run], List[str]]:
    """Every usable `run` result under paths, and one line per file skipped (results
    of the kinds in `handled` are skipped silently: the caller reads them itself)."""
    results, notes = load_results(paths)
    runs = []
    for result in results:
        if result.kind in handled:
            continue
        if result.kind != "run":
            notes.append(f"skipping {result.path}: a {result.kind!r} result; only 'run' "
                         "results are analysed here")
            continue
        try:
            runs.append(read_run(result.path, result.doc))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            notes.append(f"skipping {result.path}: incomplete or malformed run result "
                         f"({type(e).__name__}: {e})")
    return runs, notes


def read_run(path: Path, doc: Dict[str, Any]) -> Run:
    config, summary = doc["config"], doc["summary"]
    env = doc.get("environment") or {}
    samples = doc.get("samples") or {}
    device = str(env.get("device") or ("cpu" if config.get("no_cuda") else "unknown"))
    hardware = env.get("gpu") if device == "cuda" else env.get("cpu")
    key = GroupKey(str(config["model"]), int(config["batch_size"]), int(config["image_size"]),
                   int(config.get("num_classes", 1000)),
                   precision_of(config),
                   device, str(env.get("backend") or "unknown"), str(hardware or "unknown"),
                   str(config.get("tag") or ""))
    total = summary["total_img_sec"]
    totals: Tuple[float, ...] = ()
    if samples.get("iteration_seconds"):
        images = key.batch_size * int(config["num_batches_per_iter"])
        totals = tuple(metrics.total_throughput(images, samples["iteration_seconds"]).tolist())
    consensus = samples.get("consensus_distance") or ()
    return Run(
        path=Path(path), doc=doc, key=key, series=series_of(doc), workers=int(summary["workers"]),
        total=float(total["mean"]), total_ci=_float(total.get("ci95")), totals=totals,
        batch_seconds=tuple(np.ravel(samples.get("batch_seconds") or []).tolist()),
        latency={k: float(v) for k, v in summary["latency_seconds_per_batch"].items()},
        compute_only=_float(summary.get("compute_only_img_sec_per_worker")),
        efficiency_in_job=_float(summary.get("efficiency_in_job")),
        overhead=_float(summary.get("communication_overhead")),
        consensus=tuple(float(c) for c in consensus),
        final_consensus=_float(summary.get("final_consensus_distance")))


def precision_of(config: Dict[str, Any]) -> str:
    amp = config.get("amp") or "off"
    compute = "fp32" if amp == "off" else f"amp-{amp}"
    if not config.get("fp16_allreduce"):
        return compute
    return "fp16-allreduce" if compute == "fp32" else f"{compute}+fp16-allreduce"


def series_of(doc: Dict[str, Any]) -> Series:
    """The strategy and the topology settings its plugin recorded. Run flags such as
    --topology are not consulted: a strategy that ignores them (`none`) records none.
    Facts that vary with the worker count (spectral gap, number of machines) would
    split a series into single points, so only settings chosen by the user count."""
    config, strategy = doc["config"], doc.get("strategy") or {}
    name = str(strategy.get("name") or config["dist_optimizer"])
    dynamic = strategy.get("dynamic")
    if isinstance(dynamic, bool):
        dynamic = "dynamic" if dynamic else "static"
    machines = ""
    if "machine_size" in strategy and config.get("machine_size"):
        machines = f"{config['machine_size']} ranks/machine"
    return Series(name, str(strategy.get("topology") or ""), str(dynamic or ""),
                  str(strategy.get("style") or "").upper(), machines)


def combine(runs: List[Run]) -> Point:
    """One point from repeated runs of a configuration: the mean of their means, and
    the 95% CI over the runs' means (over the iterations when there is one run)."""
    first = runs[0]
    means = [r.total for r in runs]
    if len(runs) > 1:
        ci, ci_over = metrics.ci95_halfwidth(means), "runs"
    else:
        ci, ci_over = first.total_ci, "iterations"
    pooled = [s for r in runs for s in r.batch_seconds]
    if pooled and all(r.batch_seconds for r in runs):
        latency = metrics.percentiles(pooled)
    else:
        latency = {k: _mean([r.latency.get(k) for r in runs]) for k in first.latency}
    curves = [r.consensus for r in runs if r.consensus]
    length = min((len(c) for c in curves), default=0)
    return Point(
        series=first.series, workers=first.workers, runs=runs, total=float(np.mean(means)),
        ci=ci, ci_over=ci_over, totals=np.array([s for r in runs for s in r.totals]),
        latency=latency, compute_only=_mean([r.compute_only for r in runs]),
        efficiency_in_job=_mean([r.efficiency_in_job for r in runs]),
        overhead=_mean([r.overhead for r in runs]),
        final_consensus=_mean([r.final_consensus for r in runs]),
        consensus=np.mean([c[:length] for c in curves], axis=0) if length else np.array([]))


def group_runs(runs: Iterable[Run]) -> List[Group]:
    """Runs -> groups (sorted), each with its points and 1-worker baseline."""
    by_key: Dict[GroupKey, Dict[Tuple[Series, int], List[Run]]] = {}
    for run in runs:
        by_key.setdefault(run.key, {}).setdefault((run.series, run.workers), []).append(run)
    groups = []
    for key in sorted(by_key):
        cells = by_key[key]
        points = [combine(sorted(cells[c], key=lambda r: str(r.path)))
                  for c in sorted(cells, key=lambda c: (c[0].order(), c[1]))]
        # One worker does not communicate, whatever the strategy: every 1-worker run
        # of the group measures Total(1), so they are pooled into one baseline.
        singles = [r.total for p in points if p.workers == 1 for r in p.runs]
        baseline = float(np.mean(singles)) if singles else None
        if baseline:
            for p in points:
                p.efficiency = metrics.scaling_efficiency(p.total, p.workers, baseline)
        groups.append(Group(key, points, baseline if baseline else None, len(singles)))
    return groups


def analyse(paths: Iterable[Union[str, Path]],
            handled: Tuple[str, ...] = ()) -> Tuple[List[Group], List[str]]:
    runs, notes = load_runs(paths, handled)
    return group_runs(runs), notes


def _float(value) -> Optional[float]:
    return None if value is None else float(value)


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def load_for(command: str, paths: Iterable[Union[str, Path]], err) -> Optional[Tuple[
        List[Group], List[Any]]]:
    """What `report` and `plot` read: run groups and microbench results under paths,
    one warning line per skipped file on err; None, after saying so, when nothing
    usable was found."""
    from commbench.microbench import results as microbench_results

    paths = list(paths)
    groups, notes = analyse(paths, handled=(microbench_results.KIND,))
    benches = microbench_results.load(paths)  # size sweeps: their own tables and charts
    for note in notes:
        print(f"commbench {command}: warning: {note}", file=err)
    if not groups and not benches:
        print(f"commbench {command}: error: no usable commbench run results in "
              f"{', '.join(map(str, paths))}", file=err)
        return None
    return groups, benches
