"""`failure-rate-<task>.png`: time to the target against the rate of failures, one line
per contender (a strategy and its recovery policy at a worker count), for the runs of a
group made under random failure schedules (`--fail mtbf=...`) and without failures: what
each recovery policy keeps of a strategy's time to the target as failures come more
often (issue 56). The times are wall times from the job's start, failures and recoveries
included, the runs of a point combined as the time-to-target table combines them. A
point whose workers were not all there at the end (gossip's survivors go on without the
ranks they lost) says how many were: fewer workers may reach the target sooner where
communication was the cost, and the line alone would not tell."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from commbench.analysis import time_to_target as ttt
from commbench.plots.accuracy import wrapped

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from commbench.analysis.accuracy import AccuracyGroup, AccuracyRow

# (series, workers, recovery policy, seconds after which a failed rank rejoins or None)
Contender = Tuple[object, int, str, Optional[float]]


def contenders(group: "AccuracyGroup") -> Dict[Contender, List[Tuple[float, "AccuracyRow"]]]:
    """Each contender's rows at a known failure rate, by rate; only contenders seen at
    two rates or more (one point is no line). Schedules whose ranks rejoin and those
    whose ranks fail for good make two contenders, which share the run without failures."""
    found: Dict[Contender, List[Tuple[float, "AccuracyRow"]]] = {}
    unfailed: Dict[Tuple[object, int, str], List[Tuple[float, "AccuracyRow"]]] = {}
    for row in group.rows:
        rates = {r.failures_per_hour for r in row.runs}
        if len(rates) == 1 and None not in rates and row.has_target:
            rate, run = rates.pop(), row.runs[0]
            if rate == 0:
                unfailed.setdefault((row.series, row.workers, run.policy), []).append((rate, row))
            else:
                key = (row.series, row.workers, run.policy, run.rejoin)
                found.setdefault(key, []).append((rate, row))
    for key, points in found.items():
        points.extend(unfailed.get(key[:3], []))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in found.items() if len(v) > 1}


def workers_left(row: "AccuracyRow") -> Optional[int]:
    """The fewest workers left at the end of any of the row's runs, where a policy
    recorded its survivors; None where none did."""
    left = [len(r.recovery["survivors"]) for r in row.runs
            if r.recovery and r.recovery.get("survivors") is not None]
    return min(left) if left else None


def has_rates(group: "AccuracyGroup") -> bool:
    return bool(contenders(group))


def figure(group: "AccuracyGroup") -> "Figure":
    from matplotlib.figure import Figure

    from commbench.plots.scaling import MARKERS

    fig = Figure(figsize=(8.0, 6.0), layout="constrained")
    ax = fig.subplots()
    found = contenders(group)
    for i, ((series, workers, policy, rejoin), points) in enumerate(found.items()):
        timed = [(rate, row, ttt.combine([r.wall_time for r in row.runs]).value)
                 for rate, row in points]
        drawn = [(rate, row, time) for rate, row, time in timed if time is not None]
        back = f", rejoining after {rejoin:g} s" if rejoin is not None else ""
        name = f"{series.label()} + {policy}{back}, N={workers}" if policy != "none" else \
            f"{series.label()}, N={workers}, no recovery"
        line, = ax.plot([p[0] for p in drawn], [p[2] for p in drawn],
                        marker=MARKERS[i % len(MARKERS)], label=name)
        for rate, _, time in timed:
            if time is None:  # no time to give: the target was missed too often
                ax.annotate("missed", (rate, 0), textcoords="offset points", xytext=(0, 6),
                            ha="center", fontsize=7.5, color=line.get_color())
        for rate, row, time in drawn:
            left = workers_left(row)
            if left is not None and left < workers:
                # below its point: the shrinking contender is usually the lowest line
                ax.annotate(f"{left} of {workers} left", (rate, time), xytext=(0, -9),
                            textcoords="offset points", ha="center", va="top",
                            fontsize=7.5, color=line.get_color())
    ax.set_xlabel("failures per hour (--fail mtbf=...: 3600 / MTBF)", fontsize=8)
    ax.set_ylabel("wall time to target (s), failures and recoveries included", fontsize=8)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    # under the axes: a contender's line may cross any corner of them
    ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    title = "Time to target as failures come more often"
    fewest = min(len(row.runs) for points in found.values() for _, row in points)
    if fewest < 3:
        title += f" (as few as {fewest} run{'s' if fewest > 1 else ''} a point: no spread to read)"
    fig.suptitle(wrapped(title, group.key.heading(), group.key.details(), width=100),
                 fontsize=9)
    return fig
