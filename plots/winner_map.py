"""The winner map as a picture (commbench.analysis.winner_map): a grid with a network per
column (slowest link first, shared memory last) and a straggler setting per row. Left,
each cell in the colour of the strategy that did best (first to the target, or the most
images per second), with its lead over the next; a cell too close to call is hatched and
names both, a cell where none reached the target or that was never run says so in grey.
Right, the bytes each worker of the best sent (to the target, or per step). A map of
projections (`commbench simulate`'s files) has the first panel only, titled PROJECTED;
projected columns beside measured ones have dashed cells that say PROJECTED.

Built like commbench.plots.scaling: matplotlib's object API, saved by its save_named.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Dict

from commbench.analysis import winner_map as wm

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MISSING = "0.92"  # the face of a cell with no first: none reached, or not run


def figure(found: "wm.WinnerMap") -> "Figure":
    from matplotlib.figure import Figure

    width = 2.6 * len(found.networks)
    panels = [(" ".join(kind.what + "." for kind in found.kinds),
               lambda cell: "\n".join(cell.lines()))]
    if found.kind.sent:
        panels.append((found.kind.sent, wm.Cell.bytes_text))
    fig = Figure(figsize=(len(panels) * width + 3.0, 1.6 + 1.3 * len(found.stragglers)),
                 layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colors = strategy_colors(found)
    for ax, (title, text_of) in zip(axes, panels):
        _grid(ax, found, colors, text_of)
        ax.set_title(textwrap.fill(title, 90), fontsize=8)
    heading = "PROJECTED winner map" if found.kind is wm.PROJECTED else "Winner map"
    fig.suptitle(f"{heading}\n" + textwrap.fill(found.title, 150), fontsize=9)
    return fig


def strategy_colors(found: "wm.WinnerMap") -> Dict[str, str]:
    """A colour per strategy that is first somewhere, the same in both panels and on
    every network (whatever layout of machines it ran on there)."""
    names = sorted({cell.ranked[0].strategy for cell in found.cells.values() if cell.ranked})
    return {name: f"C{i % 10}" for i, name in enumerate(names)}


def _grid(ax: "Axes", found: "wm.WinnerMap", colors: Dict[str, str], text_of) -> None:
    from matplotlib.patches import Rectangle

    for y, stragglers in enumerate(found.stragglers):
        for x, network in enumerate(found.networks):
            cell = found.cells.get((stragglers, network))
            face, hatch, text = MISSING, None, wm.unfilled(network)
            projected = cell is not None and cell.kind.projected
            if cell is not None:
                text = text_of(cell)
                if cell.ranked:
                    face = colors[cell.ranked[0].strategy]
                    hatch = "//" if cell.verdict == wm.TOO_CLOSE else None
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor=face, alpha=0.35, hatch=hatch,
                                   edgecolor="white", linewidth=2))
            if projected and found.kind is not wm.PROJECTED:  # beside measured cells
                ax.add_patch(Rectangle((x + 0.03, y + 0.03), 0.94, 0.94, fill=False,
                                       edgecolor="0.3", linestyle="--", linewidth=1))
            ax.text(x + 0.5, y + 0.5, "\n".join(textwrap.fill(line, 28)
                                                for line in text.splitlines()),
                    ha="center", va="center", fontsize=7)
    ax.set_xlim(0, len(found.networks))
    ax.set_ylim(len(found.stragglers), 0)
    ax.set_xticks([x + 0.5 for x in range(len(found.networks))],
                  [wm.column_name(n) for n in found.networks], fontsize=8)
    ax.set_yticks([y + 0.5 for y in range(len(found.stragglers))],
                  [textwrap.fill(wm.row_name(s), 18) for s in found.stragglers], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
