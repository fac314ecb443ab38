"""Charts of runs trained to accuracy, one group of comparable runs each (see
commbench.analysis.accuracy):

- the curves: the averaged model's accuracy (solid) and the worst worker's (dashed, same
  colour) against training time and against epochs, one line per strategy and worker
  count, drawn from its run of median time to target, its other repeats faint; a
  language model's: the averaged model's validation loss, its target a loss;
- the time to target per strategy and worker count: the combined time (MLPerf's rule;
  hollow where too few runs made it the median) with whiskers from the fastest to the
  slowest run that reached the target, each such run a small tick; runs that missed it
  are said in words beside the row, never placed on the time axis, and so is a failure
  schedule (--fail, --recovery) the row's runs ran under;
- where runs ran under failures, their goodput beside their throughput during training.

Built like commbench.plots.scaling: matplotlib's object API, saved by its save_named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Tuple

from commbench import units

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from commbench.analysis.accuracy import AccuracyGroup, AccuracyRow

FAINT = 0.25  # alpha of a row's other repeats: present, but behind its median run
Cell = Tuple[object, int, str]  # (series, workers, failures): a row of a group (its cell)


def label(row: "AccuracyRow") -> str:
    under = f", {row.failures}" if row.failures else ""
    return f"{row.series.label()}, N={row.workers}{under}"


def palette(groups: List["AccuracyGroup"]) -> Dict[Cell, dict]:
    """A colour and a marker per (strategy, workers), the same across one call's charts;
    the compute-only `none` in scaling's grey."""
    from commbench.plots.scaling import MARKERS, NONE_COLOR

    cells = sorted({r.cell for g in groups for r in g.rows},
                   key=lambda c: (c[0].order(), *c[1:]))
    colors = iter(f"C{i % 10}" for i in range(len(cells)))
    return {c: {"color": NONE_COLOR if c[0].strategy == "none" else next(colors),
                "marker": MARKERS[i % len(MARKERS)]} for i, c in enumerate(cells)}


def curves_figure(group: "AccuracyGroup", styles: Dict[Cell, dict]) -> "Figure":
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(11.0, 4.8), layout="constrained")
    by_time, by_epoch = fig.subplots(1, 2, sharey=True)
    loss = group.key.by_loss
    for ax, x, name in ((by_time, "training_seconds", "training time (s, evaluation paused)"),
                        (by_epoch, "epoch", "epochs")):
        for row in group.rows:
            _curves(ax, row, x, styles[row.cell], loss)
        if group.key.target:
            ax.axhline(float(group.key.target.replace("loss ", "")), color="black",
                       linestyle=":", linewidth=1)
        ax.set_xlabel(name)
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
    metric = "Loss" if loss else "Accuracy"
    by_time.set_ylabel("validation loss (nats per token)" if loss else "validation accuracy")
    if not loss:
        by_time.set_ylim(0, 1.02)
    by_time.set_title(f"{metric} against training time", fontsize=10)
    by_epoch.set_title(f"{metric} against epochs", fontsize=10)
    fig.suptitle(wrapped(group.key.heading(), group.key.details(), width=140), fontsize=9)
    handles = [Line2D([], [], color=styles[r.cell]["color"], linewidth=1.8)
               for r in group.rows]
    labels = [label(r) for r in group.rows]
    handles.append(Line2D([], [], color="0.3", linestyle="-"))
    labels.append("averaged model (bold: the run of median time to target)")
    if not loss:  # a language model's workers are scored by their next-token accuracy
        handles.append(Line2D([], [], color="0.3", linestyle="--"))
        labels.append("worst worker")
    if group.key.target:
        handles.append(Line2D([], [], color="black", linestyle=":"))
        labels.append(f"target {group.key.target}")
    # long labels (a decentralized strategy's settings) fit the figure's width two a row
    columns = 3 if max(len(text) for text in labels) <= 50 else 2
    fig.legend(handles, labels, loc="outside lower center", ncol=min(columns, len(labels)),
               fontsize=8, frameon=False)
    return fig


def _curves(ax: "Axes", row: "AccuracyRow", x: str, style: dict, loss: bool) -> None:
    y = "validation_loss" if loss else "accuracy"
    main = row.representative()
    for run in row.runs:
        if run is not main:
            ax.plot([p[x] for p in run.curve], [p.get(y) for p in run.curve],
                    color=style["color"], linewidth=0.8, alpha=FAINT)
    xs = [p[x] for p in main.curve]
    ax.plot(xs, [p.get(y) for p in main.curve], color=style["color"], linewidth=1.8,
            marker=style["marker"], markersize=3.5)
    if not loss:
        ax.plot(xs, [p["worker_worst"] for p in main.curve], color=style["color"],
                linewidth=1.2, linestyle="--")


def time_figure(group: "AccuracyGroup", styles: Dict[Cell, dict]) -> "Figure":
    from matplotlib.figure import Figure

    rows = [r for r in group.rows if r.has_target]
    fig = Figure(figsize=(9.0, 1.9 + 0.5 * len(rows)), layout="constrained")
    ax = fig.subplots()
    longest = max([t for r in rows for t in r.times() if t is not None], default=1.0)
    for y, row in enumerate(rows):
        style = styles[row.cell]
        times = [t for t in row.times() if t is not None]
        combined = row.combined()
        if times:
            ax.plot([min(times), max(times)], [y, y], color=style["color"], linewidth=1.2)
            ax.plot(times, [y] * len(times), linestyle="none", marker="|", markersize=10,
                    color=style["color"])
        if combined.value is not None:
            hollow = combined.rule != "olympic"
            ax.plot([combined.value], [y], linestyle="none", marker=style["marker"],
                    markersize=8, color=style["color"],
                    markerfacecolor="white" if hollow else style["color"])
        missed = len(row.runs) - row.reached
        words = f"{row.reached}/{len(row.runs)} reached"
        sent = row.median_of("sent")
        if sent is not None:
            words += f", {units.format_bytes(sent)} sent per worker"
        if missed and group.key.by_loss:
            words += f"; {missed} missed (lowest loss {row.best_loss_missed:.4f})"
        elif missed:
            words += f"; {missed} missed (best {row.best_missed:.3f})"
        if combined.value is None:
            words += f"; no time: {combined.label()}"
        ax.annotate(words, (max(times) if times else 0.0, y), textcoords="offset points",
                    xytext=(8, 0), va="center", fontsize=7.5, color=style["color"])
    # wrapped, so that a long strategy name leaves the axes their width
    ax.set_yticks(range(len(rows)), [wrapped(label(r), width=48) for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
    ax.set_xlim(0, longest * 1.6)  # room on the right for the words
    ax.set_xlabel(wrapped("training time to target (s)", "filled: MLPerf's rule (fastest "
                          "and slowest run dropped, mean of the rest); hollow: the median "
                          "(too few runs); bar and ticks: the runs that reached the target; "
                          "sent: the median bytes a worker put on the wire to the target "
                          "(binary units: 1G = 2^30 bytes)",
                          width=70), fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(wrapped("Time to target", group.key.heading(), group.key.details(),
                         width=100), fontsize=9)
    return fig


def goodput_figure(group: "AccuracyGroup", styles: Dict[Cell, dict]) -> "Figure":
    """Per strategy and worker count, the throughput during training (solid) and, where
    its runs ran under a recovery policy, the goodput (hatched: useful samples per
    second of wall time, failures and recoveries included), with the failure schedule
    said beside the row."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = group.rows
    fig = Figure(figsize=(9.0, 2.2 + 0.6 * len(rows)), layout="constrained")
    ax = fig.subplots()
    unit = "tokens" if group.key.by_loss else "images"
    for y, row in enumerate(rows):
        color = styles[row.cell]["color"]
        if row.img_sec is not None:
            ax.barh(y - 0.2, row.img_sec, height=0.4, color=color)
        if row.goodput is not None:
            ax.barh(y + 0.2, row.goodput, height=0.4, color="white", edgecolor=color,
                    hatch="//")
        ax.annotate(f"under {row.failures}" if row.failures else "no failures",
                    (max(row.img_sec or 0.0, row.goodput or 0.0), y),
                    textcoords="offset points", xytext=(8, 0), va="center", fontsize=7.5,
                    color=color)
    ax.set_yticks(range(len(rows)), [wrapped(label(r), width=48) for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
    widest = max([v for r in rows for v in (r.img_sec, r.goodput) if v is not None],
                 default=1.0)
    ax.set_xlim(0, widest * 1.8)  # room on the right for the words
    ax.set_xlabel(f"{unit}/sec, all workers", fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.legend(handles=[Patch(color="0.4", label="during training (the steps alone)"),
                        Patch(facecolor="white", edgecolor="0.4", hatch="//",
                              label="goodput: useful samples per second of wall time, "
                              "failures and recoveries included")],
               loc="outside lower center", ncol=1, fontsize=8, frameon=False)
    fig.suptitle(wrapped("Goodput under failures", group.key.heading(), group.key.details(),
                         width=100), fontsize=9)
    return fig


def has_failures(group: "AccuracyGroup") -> bool:
    """Whether any of its runs ran under --fail or a recovery policy."""
    return any(r.failures for r in group.rows)


def wrapped(*lines: str, width: int) -> str:
    """Lines broken to fit a figure of about `width` characters."""
    import textwrap

    return "\n".join(part for line in lines for part in textwrap.wrap(line, width))


def has_times(group: "AccuracyGroup") -> bool:
    return any(r.has_target for r in group.rows)
