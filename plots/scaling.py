"""The scaling chart of one group of comparable runs (see commbench.analysis.runs).

Panels: total img/sec versus workers with 95% CI error bars, the ideal linear line
and each point's scaling efficiency; efficiency versus workers; and, when
decentralized runs recorded it, consensus distance per iteration.

Figures are built with matplotlib's object API (no pyplot): no global state, no
display needed, and a figure is freed as soon as it is no longer referenced.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Tuple

from commbench.analysis import grouping

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from commbench.analysis.runs import Group, Point, Series

MARKERS = "osD^vPX*"
NONE_COLOR = "0.45"  # the compute-only `none` strategy: a reference, drawn in grey
# Beyond this ratio of largest to smallest worker count, a linear throughput axis
# squashes the small counts into the floor; log-log keeps ideal scaling a straight line.
LOG_Y_ABOVE = 8
LABEL_GAP = 9  # points between the centres of two efficiency labels
CHAR_INCHES = 0.075  # width of a legend character at font size 9
DOUBT = {"E(N)>100%", "E*>100%", "noisy", "oversubscribed"}  # flags that put E in doubt


def figure(group: "Group", styles: Optional[Dict["Series", dict]] = None) -> "Figure":
    """The chart of one group; pass styles(all series) to keep a strategy's colour and
    marker the same across the charts of one call."""
    from matplotlib.figure import Figure

    # one worker agrees with itself: its consensus distance is 0 by definition
    consensus = [p for p in group.points if len(p.consensus) and p.workers > 1]
    panels = 3 if consensus else 2
    fig = Figure(figsize=(5.0 * panels, 4.6), layout="constrained")
    axes = fig.subplots(1, panels)
    style = styles or palette(group.series)
    efficiency_name = "E(N)" if group.baselines else "E*"
    _throughput(axes[0], group, style, efficiency_name)
    _efficiency(axes[1], group, style, efficiency_name)
    if consensus:
        _consensus(axes[2], consensus, style)
    fig.suptitle(group.key.title() + doubts(group), fontsize=11)
    handles, labels = axes[0].get_legend_handles_labels()
    order = sorted(range(len(labels)),
                   key=lambda i: labels[i].startswith(("ideal", "oversubscribed")))
    # As many columns as the longest label lets fit across the figure.
    fits = int(5.0 * panels / (CHAR_INCHES * (max(map(len, labels)) + 6)))
    fig.legend([handles[i] for i in order], [labels[i] for i in order],
               loc="outside lower center", ncol=max(1, min(4, len(labels), fits)), fontsize=9,
               frameon=False)
    return fig


def doubts(group: "Group") -> str:
    """A second title line when some point is not to be trusted, and why (the FLAGS
    codes): a reader who sees only the picture must not take those points at face value."""
    doubtful = [p for p in group.points if p.flags]
    if not doubtful:
        return ""
    why = dict.fromkeys(f for p in doubtful for f in p.flags)
    return (f"\n{len(doubtful)} of {len(group.points)} points not to be trusted "
            f"({', '.join(why)}): see `commbench report`")


def save_named(fig: "Figure", out_dir, name: str, formats=()) -> list:
    """Save fig as out_dir/name.png and in each further format; the paths written."""
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.{ext}" for ext in dict.fromkeys(["png", *formats])]
    save(fig, paths)
    return paths


def save(fig: "Figure", paths) -> None:
    import os
    import tempfile

    for path in paths:
        # Draw into a temporary file and rename it into place: a viewer, or a second
        # `plot` writing the same chart at once, never sees half a picture.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".partial-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                fig.savefig(f, dpi=150, format=path.suffix[1:])
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    fig.clear()  # release the artists now, not at the next garbage collection


def palette(series: Iterable["Series"]) -> Dict["Series", dict]:
    """A colour and a marker per series, in the series' order."""
    from commbench.analysis.runs import Series

    ordered = sorted(set(series), key=Series.order)
    colors = iter(f"C{i % 10}" for i in range(len(ordered)))
    return {s: {"color": NONE_COLOR if s.strategy == "none" else next(colors),
                "marker": MARKERS[i % len(MARKERS)]}
            for i, s in enumerate(ordered)}


def _points(group: "Group", series: "Series") -> List["Point"]:
    return [p for p in group.points if p.series == series]


def _efficiency_of(point: "Point", name: str):
    return point.efficiency if name == "E(N)" else point.efficiency_in_job


def _workers_axis(ax: "Axes", workers: List[int]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(workers))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(workers[0] / 1.4, workers[-1] * 1.4)
    ax.set_xlabel("workers")
    ax.grid(True, alpha=0.3)


def _throughput(ax: "Axes", group: "Group", style, efficiency_name: str) -> None:
    labels: List[Tuple[int, float, str, str]] = []
    for s in group.series:
        points = _points(group, s)
        x = [p.workers for p in points]
        y = [p.total for p in points]
        yerr = [p.ci or 0.0 for p in points]
        diverged = " (diverged)" if any(p.diverged for p in points) else ""
        ax.errorbar(x, y, yerr=yerr, capsize=3, linewidth=1.6, markersize=5,
                    label=s.label() + diverged, **style[s])
        _hollow(ax, [(p.workers, p.total) for p in points if p.oversubscribed], style[s])
        for p in points:
            e = _efficiency_of(p, efficiency_name)
            if e is not None:
                doubt = "!" if DOUBT & set(p.flags) else ""
                labels.append((p.workers, p.total, f"{100 * e:.0f}%{doubt}",
                               style[s]["color"]))
    if any(p.oversubscribed for p in group.points):
        ax.plot([], [], linestyle="none", marker="o", markersize=9, markerfacecolor="white",
                markeredgecolor="black",
                label="oversubscribed: more workers than cores (CPU sharing)")
    ideal, source = group.ideal()
    if ideal:
        xs = sorted(ideal)
        ax.plot(xs, [ideal[n] for n in xs], "--", color="black", linewidth=1, alpha=0.6,
                marker="_" if len(xs) == 1 else None, markersize=14,  # one point: no line
                label=f"ideal: {source}")
    workers = group.workers
    _workers_axis(ax, workers)
    if workers[-1] / workers[0] > LOG_Y_ABOVE:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_ylabel(f"total {grouping.rate(group)}")
    ax.set_title(f"Total throughput (bars: 95% CI, labels: {efficiency_name}; "
                 "!: not to be trusted)", fontsize=10)
    _label_points(ax, labels)


def _hollow(ax: "Axes", xy: List[Tuple[int, float]], style: dict) -> None:
    """Oversubscribed points: hollow, over the filled marker (CPU sharing, not
    communication)."""
    if xy:
        ax.plot(*zip(*xy), linestyle="none", marker=style["marker"], markersize=9,
                markerfacecolor="white", markeredgecolor=style["color"], zorder=3)


def _label_points(ax: "Axes", labels: List[Tuple[int, float, str, str]]) -> None:
    """Efficiency labels right of their points, nudged apart vertically where the
    points of several strategies crowd one worker count (needs the final limits)."""
    ax.get_ylim()  # settles the autoscaled limits that the transform below uses
    to_points = 72 / ax.figure.dpi
    for n in sorted({label[0] for label in labels}):
        here = sorted((ax.transData.transform((n, y))[1] * to_points, text, color, y)
                      for x, y, text, color in labels if x == n)
        last = float("-inf")
        for at, text, color, y in here:
            placed = max(at, last + LABEL_GAP)
            last = placed
            ax.annotate(text, (n, y), textcoords="offset points", xytext=(7, placed - at),
                        fontsize=7.5, color=color, va="center",
                        bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none",
                              "alpha": 0.8})


def _efficiency(ax: "Axes", group: "Group", style, efficiency_name: str) -> None:
    top = 1.0
    for s in group.series:
        known = [(p, _efficiency_of(p, efficiency_name)) for p in _points(group, s)]
        known = [(p, 100 * e) for p, e in known if e is not None]
        pairs = [(p.workers, e) for p, e in known]
        if pairs:
            ax.plot(*zip(*pairs), linewidth=1.6, markersize=5, **style[s])
            _hollow(ax, [(p.workers, e) for p, e in known if p.oversubscribed], style[s])
            top = max(top, max(e for _, e in pairs) / 100)
    ax.axhline(100, color="black", linestyle="--", linewidth=1, alpha=0.6)
    _workers_axis(ax, group.workers)
    ax.set_ylim(0, 100 * top * 1.1)
    ax.set_ylabel("scaling efficiency (%)")
    if efficiency_name == "E(N)":
        ax.set_title("E(N) = Total(N) / (N × the same strategy's Total(1))", fontsize=10)
    else:
        ax.set_title("E* = Total / compute-only rate in the same job", fontsize=10)


def _consensus(ax: "Axes", points: List["Point"], style) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    counts = sorted({p.workers for p in points}, reverse=True)
    dashes = {n: ["-", "--", ":", "-."][i % 4] for i, n in enumerate(counts)}  # most: solid
    # a diverged run's NaN or inf is no reason to draw everyone else's on a linear axis
    positive = all(v > 0 for p in points for v in p.consensus if math.isfinite(v))
    for p in points:
        ax.plot(range(1, len(p.consensus) + 1), p.consensus, linestyle=dashes[p.workers],
                color=style[p.series]["color"], linewidth=1.4)
    ax.legend([Line2D([], [], color="0.3", linestyle=dashes[n]) for n in counts],
              [f"N={n}" for n in counts], fontsize=8, title="workers", title_fontsize=8)
    if positive:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("consensus distance")
    ax.set_title(r"Consensus distance $\|x_r - \bar{x}\|^2 / \|\bar{x}\|^2$", fontsize=10)
    ax.grid(True, alpha=0.3)
