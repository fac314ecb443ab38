"""Where a step's time goes, per strategy and worker count of one group of comparable
runs: stacked bars of compute, compression codec, exposed communication, waiting for
peers, injected delay (--slow-ranks) and other (they add up to the step), with the
communication hidden behind compute outlined inside the compute bar."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from commbench.timing.step_split import LATER  # parts older results lack: in the legend where drawn

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from commbench.analysis.runs import Group

STACK = [("compute", "compute", "#4c72b0"), ("codec", "compression codec", "#8172b3"),
         ("exposed", "exposed communication", "#dd8452"),
         ("waiting", "waiting for peers", "#c44e52"),
         ("injected", "injected delay (stragglers on purpose)", "#937860"),
         ("other", "other", "0.7")]


def figure(group: "Group") -> "Figure":
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    bars = [(p, p.split) for p in group.points]
    bars = [(p, s) for p, s in bars if s is not None]
    fig = Figure(figsize=(9.0, 1.6 + 0.45 * len(bars)), layout="constrained")
    ax = fig.subplots()
    labels: List[str] = []
    for y, (point, split) in enumerate(bars):
        left = 0.0
        for part, _, color in STACK:
            width = 1e3 * split.get(part, 0.0)  # LATER parts: not in older results
            ax.barh(y, width, left=left, color=color, height=0.7)
            left += width
        ax.barh(y, 1e3 * min(split["overlapped"], split["compute"]), height=0.7, fill=False,
                edgecolor="white", linestyle=":", linewidth=1.2)
        labels.append(f"{point.series.label()}, N={point.workers}")
    ax.set_yticks(range(len(bars)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (mean over ranks, steps and runs)")
    fig.suptitle(f"Where a step's time goes\n{group.key.title()}", fontsize=10)
    shown = [part for part in STACK if any(s.get(part[0]) for _, s in bars)
             or part[0] not in LATER]
    handles = [Patch(color=color, label=name) for _, name, color in shown]
    handles.append(Patch(facecolor="#4c72b0", edgecolor="white", linestyle=":",
                         label="of it hidden behind compute (dotted)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return fig
