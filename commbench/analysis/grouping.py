"""Combining runs: repeated runs of one configuration into a point (means, intervals
over the runs, pooled latencies), points into groups, and each series' Total(1)."""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from commbench.result import metrics
from commbench.analysis.runs import Baseline, Group, GroupKey, Point, Run, Series


def rate(group: Group) -> str:
    """The group's throughput in the unit its runs counted: img/sec or tokens/sec (a
    group holds one model, so one unit)."""
    return metrics.rate_name(group.points[0].runs[0].doc["summary"])


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


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None
