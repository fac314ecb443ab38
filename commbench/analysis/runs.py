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
    network: str  # "" on real machines; the link rate (tc's spelling) on an emulated cluster
    hardware: str  # GPU name, else CPU name: runs from different machines never pool
    tag: str

    def title(self) -> str:
        parts = [self.model, f"batch {self.batch_size} per worker",
                 f"{self.image_size}x{self.image_size} images"]
        if self.num_classes != 1000:
            parts.append(f"{self.num_classes} classes")
        parts += [self.precision, f"{self.device} ({self.hardware})", self.backend]
        if self.network:
            parts.append(emulated(self.network))
        if self.tag:
            parts.append(f"tag {self.tag}")
        return ", ".join(parts)

    def slug(self) -> str:
        parts = [self.model, f"bs{self.batch_size}", f"{self.image_size}px"]
        if self.num_classes != 1000:
            parts.append(f"{self.num_classes}cls")
        parts += [self.precision, self.device, self.backend]
        if self.network:
            parts.append(f"emulated-{self.network}")
        if self.tag:
            parts.append(self.tag)
        return "-".join(parts)

    def matching(self) -> Tuple:
        """The part `compare` matches on: arms may differ in hardware and tag."""
        return tuple(self)[:8]


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
    efficiency_in_job_ci: Optional[float]
    overhead: Optional[float]
    overhead_ci: Optional[float]
    consensus: Tuple[float, ...]  # per iteration; () for global strategies
    final_consensus: Optional[float]
    oversubscribed: bool  # more workers on a machine than physical cores
    flags: Tuple[str, ...]  # metrics.trust_flags of its summary

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
    def flags(self) -> List[str]:
        """What not to trust about this point (metrics.FLAGS codes), judged on its
        combined numbers (a repeat can settle what one run could not)."""
        summary = {"total_img_sec": {"mean": self.total, "ci95": self.ci},
                   "efficiency_in_job": self.efficiency_in_job,
                   "communication_overhead": self.overhead,
                   "oversubscribed": self.oversubscribed}
        found = metrics.trust_flags(summary, self.efficiency)
        late = any("reference" in r.flags for r in self.runs)
        return found + ["reference"] * late


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
                   device, str(env.get("backend") or "unknown"), network_of(env),
                   str(hardware or "unknown"),
                   str(config.get("tag") or ""))
    total = summary["total_img_sec"]
    totals: Tuple[float, ...] = ()
    if samples.get("iteration_seconds"):
        images = key.batch_size * int(config["num_batches_per_iter"])
        totals = tuple(metrics.total_throughput(images, samples["iteration_seconds"]).tolist())
    consensus = samples.get("consensus_distance") or ()
    crowded = oversubscribed(doc)
    return Run(
        path=Path(path), doc=doc, key=key, series=series_of(doc), workers=int(summary["workers"]),
        total=float(total["mean"]), total_ci=_float(total.get("ci95")), totals=totals,
        batch_seconds=tuple(np.ravel(samples.get("batch_seconds") or []).tolist()),
        latency={k: float(v) for k, v in summary["latency_seconds_per_batch"].items()},
        compute_only=_float(summary.get("compute_only_img_sec_per_worker")),
        efficiency_in_job=_float(summary.get("efficiency_in_job")),
        efficiency_in_job_ci=_float(summary.get("efficiency_in_job_ci95")),
        overhead=_float(summary.get("communication_overhead")),
        overhead_ci=_float(summary.get("communication_overhead_ci95")),
        consensus=tuple(float(c) for c in consensus),
        final_consensus=_float(summary.get("final_consensus_distance")),
        oversubscribed=crowded,
        flags=tuple(metrics.trust_flags({**summary, "oversubscribed": crowded})))


def oversubscribed(doc: Dict[str, Any]) -> bool:
    """More CPU workers on a machine than it has cores, as the run recorded it, or
    for results from before it did, from their hostnames and core counts."""
    summary, env = doc["summary"], doc.get("environment") or {}
    if "oversubscribed" in summary:
        return bool(summary["oversubscribed"])
    hosts = env.get("hostnames") or []
    cores = env.get("cpu_count")
    if env.get("device") != "cpu" or not hosts or not cores:
        return False
    return max(hosts.count(h) for h in hosts) > cores


def precision_of(config: Dict[str, Any]) -> str:
    amp = config.get("amp") or "off"
    compute = "fp32" if amp == "off" else f"amp-{amp}"
    if not config.get("fp16_allreduce"):
        return compute
    return "fp16-allreduce" if compute == "fp32" else f"{compute}+fp16-allreduce"


def network_of(env: Dict[str, Any]) -> str:
    """The network runs must share to be compared: '' for real machines, else the
    emulated cluster's link rate."""
    found = env.get("emulated_network")
    return str(found.get("link")) if isinstance(found, dict) else ""


def emulated(link: str) -> str:
    """How titles name an emulated network."""
    return f"emulated, {link} links network"


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
    elif network_of(doc.get("environment") or {}):  # a layout the user chose by -H
        machines = f"{doc['environment'].get('machine_size') or 'uneven'} ranks/machine"
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
    efficiency, efficiency_ci = _combined([r.efficiency_in_job for r in runs],
                                          [r.efficiency_in_job_ci for r in runs])
    overhead, overhead_ci = _combined([r.overhead for r in runs], [r.overhead_ci for r in runs])
    return Point(
        series=first.series, workers=first.workers, runs=runs, total=float(np.mean(means)),
        ci=ci, ci_over=ci_over, totals=np.array([s for r in runs for s in r.totals]),
        latency=latency, compute_only=_mean([r.compute_only for r in runs]),
        efficiency_in_job=efficiency, efficiency_in_job_ci=efficiency_ci,
        overhead=overhead, overhead_ci=overhead_ci,
        final_consensus=_mean([r.final_consensus for r in runs]),
        consensus=np.mean([c[:length] for c in curves], axis=0) if length else np.array([]),
        oversubscribed=any(r.oversubscribed for r in runs))


def _combined(values: List[Optional[float]], cis: List[Optional[float]]
              ) -> Tuple[Optional[float], Optional[float]]:
    """A quantity over repeated runs: the mean of the runs' values with the 95% CI over
    them; one run: its value with its own CI."""
    known = [v for v in values if v is not None]
    if not known:
        return None, None
    if len(known) == 1:
        return known[0], cis[values.index(known[0])]
    return float(np.mean(known)), metrics.ci95_halfwidth(known)


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
        baselines = _baselines(points)
        for p in points:
            base = baselines.get(p.series)
            if base is not None and base.total > 0:
                p.efficiency = metrics.scaling_efficiency(p.total, p.workers, base.total)
                p.efficiency_ci = metrics.ratio_ci95(p.efficiency, p.total, p.ci, base.total,
                                                     base.ci)
        groups.append(Group(key, points, baselines))
    return groups


def _baselines(points: List[Point]) -> Dict[Series, Baseline]:
    """Each series' Total(1): its own 1-worker point, else the compute-only `none`'s."""
    own = {p.series: Baseline(p.total, p.ci, len(p.runs), p.series)
           for p in points if p.workers == 1}
    fallback = next((b for s, b in own.items() if s.strategy == "none"), None)
    found = {}
    for series in {p.series for p in points}:
        base = own.get(series, fallback)
        if base is not None:
            found[series] = base
    return found


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
        List[Group], List[Any], List[Any]]]:
    """What `report` and `plot` read: run groups, microbench results and projections
    (commbench simulate's, shown apart and labelled) under paths, one warning line per
    skipped file on err; None, after saying so, when nothing usable was found."""
    from commbench.microbench import results as microbench_results
    from commbench.simulate import projection_file as simulate

    paths = list(paths)
    groups, notes = analyse(paths, handled=(microbench_results.KIND, simulate.KIND))
    benches = microbench_results.load(paths)  # size sweeps: their own tables and charts
    projections = simulate.load(paths)
    for note in notes:
        print(f"commbench {command}: warning: {note}", file=err)
    if not groups and not benches and not projections:
        print(f"commbench {command}: error: no usable commbench run results in "
              f"{', '.join(map(str, paths))}", file=err)
        return None
    return groups, benches, projections
