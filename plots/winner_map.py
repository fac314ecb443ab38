"""The winner map as a picture (commbench.analysis.winner_map), drawn to be read at a
glance at a page's width: a network per column (slowest link first, shared memory
last) and a straggler setting per row. Each cell is in the colour of the strategy that
did best (first to the target, or the most images per second) and holds its short name
and its lead over the next as a factor ("1.6×"); a cell too close to call is split
between the colours of the two and says "too close"; a cell where none reached the
target, or that was never run, says so in grey. Projected cells (commbench's cost model,
not a measurement) are hatched inside a dashed frame. The legend names each colour's
strategy in full and the projected mark. The ranges, bytes and steps stay in
`report`'s table (commbench.analysis.winner_table).

Built like commbench.plots.scaling: matplotlib's object API, saved by its save_named.
"""

from __future__ import annotations

import math
import re
import textwrap
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from commbench.analysis import winner_cells as wc

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MISSING = "0.92"  # the face of a cell with no first: none reached, or not run
ALPHA = 0.45  # pale enough for black text on every colour of the cycle
# save_named draws at 150 dpi: 13.3 inches is 1,995 px, under the 2,000 px a page
# can show without shrinking the cells' print below reading size
MAX_WIDTH, MIN_WIDTH, ROW_LABELS, CELL, ROW = 13.3, 8.0, 1.6, 1.9, 0.95
FONT = 12.0  # points, in a cell CELL inches wide
SINGLE_MARK = " *"
PAIRED_MARK = " †"
HATCH, PROJECTED_EDGE = "/", "0.55"  # sparse and pale: the cell's text stays legible


def figure(found: "wc.WinnerMap") -> "Figure":
    from matplotlib.figure import Figure

    cell = min(CELL, (MAX_WIDTH - ROW_LABELS) / len(found.networks))
    font = max(6.0, FONT * cell / CELL)
    wide = max(MIN_WIDTH, ROW_LABELS + cell * len(found.networks))  # room for the titles
    colors = strategy_colors(found)
    handles = legend_handles(found, colors)
    columns = min(len(handles), 2 if wide > 10 else 1) or 1
    heading = "PROJECTED winner map" if found.kind is wc.PROJECTED else "Winner map"
    # lines as long as the figure (or the grid) is wide: 10 characters an inch at 12
    # points, 13 at 9
    heading = textwrap.fill(f"{heading}: {found.heading}", int(wide * 10))
    subtitle = "\n".join(textwrap.fill(text, int((wide - ROW_LABELS) * 13))
                         for text in (found.details, caption(found)) if text)
    # the rows keep their height whatever the titles and the legend take
    height = (0.25 * (heading.count("\n") + 1) + 0.18 * (subtitle.count("\n") + 1) + 0.7
              + ROW * len(found.stragglers) + 0.3 * math.ceil(len(handles) / columns))
    fig = Figure(figsize=(wide, height), layout="constrained")
    ax = fig.subplots()
    # told apart from every strategy the map ranks, not only those painted: a cell's
    # "allreduce" must not read as plain allreduce where its bf16 form was the one
    names = short_names(sorted({entry.strategy for c in found.cells.values()
                                for entry in c.ranked}))
    across = (wide - ROW_LABELS) / len(found.networks)  # a cell's width on the page
    width = max(8, int(across * 72 / (0.62 * font)))  # the characters a line of it holds
    _grid(ax, found, colors, {k: wrap_name(v, width) for k, v in names.items()}, font)
    ax.set_title(subtitle, fontsize=9)
    fig.suptitle(heading, fontsize=12)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=columns,
                   fontsize=9, frameon=False)
    return fig


def caption(found: "wc.WinnerMap") -> str:
    """What a cell shows, and where the rest is."""
    if found.kind.lower_is_better:
        subject, lead = "the first to the target", "the next's time over the first's"
    else:
        subject, lead = "the most images per second", "the first's rate over the next's"
    verdicts = {c.verdict for c in found.cells.values()}
    return (f"Each cell: {subject} and its lead ({lead})"
            + (f"; {SINGLE_MARK.strip()} single runs, the lead has no interval"
               if wc.SINGLE in verdicts else "")
            + (f"; {PAIRED_MARK.strip()} ranges overlap, but ahead paired by seed (95% CI)"
               if wc.PAIRED in verdicts else "")
            + ". Ranges, bytes and steps: `commbench report`.")


def strategy_colors(found: "wc.WinnerMap") -> Dict[str, str]:
    """A colour per strategy that is first (or second in a cell too close to call)
    somewhere, the same on every network (whatever layout of machines it ran on there)."""
    names = sorted({entry.strategy for cell in found.cells.values()
                    for entry in shown(cell)})
    return {name: f"C{i % 10}" for i, name in enumerate(names)}


def shown(cell: "wc.Cell") -> List["wc.Entry"]:
    """The entries a cell is painted with: the first, and the next where too close."""
    return cell.ranked[:2] if cell.verdict == wc.TOO_CLOSE else cell.ranked[:1]


def short_names(strategies: List[str]) -> Dict[str, str]:
    """Each strategy's name without its settings ("local_sgd (H=8)": "local_sgd"), but
    for as few as tell it from the others of the same name in the list."""
    parsed = {s: (s.partition(" (")[0], s.partition(" (")[2].rstrip(")").split(", "))
              for s in strategies}
    out = {}
    for strategy, (name, settings) in parsed.items():
        others = [o for s, (n, o) in parsed.items() if n == name and s != strategy]
        own = []
        for part in settings:  # a setting that tells it from some, until from all
            if others and part and any(part not in o for o in others):
                own.append(part)
                others = [o for o in others if part in o]
        out[strategy] = " ".join([name] + own)
    return out


def wrap_name(name: str, width: int) -> str:
    """A name in lines of at most width characters where it can, broken after an
    underscore or a space (textwrap breaks at spaces only)."""
    lines = [""]
    for piece in re.split(r"(?<=[_ ])", name):
        if lines[-1] and len(lines[-1] + piece.rstrip()) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(line.rstrip() for line in lines)


def cell_text(cell: Optional["wc.Cell"], network: str, names: Dict[str, str]
              ) -> Tuple[str, str]:
    """(what a cell says large, what it says below): the first's short name and its
    lead, "too close" and the two, or why there is no first."""
    if cell is None:
        return wc.unfilled(network), ""
    if not cell.ranked:
        return wc.NONE, ""
    first = names[cell.ranked[0].strategy]
    if cell.verdict == wc.ALONE:
        return first, "the only one"
    if cell.verdict == wc.TOO_CLOSE:
        return "too close", f"{first}\n~ {names[cell.ranked[1].strategy]}"
    if cell.ratio is None:  # a figure of 0: no factor to give
        return first, ""
    mark = {wc.SINGLE: SINGLE_MARK, wc.PAIRED: PAIRED_MARK}.get(cell.verdict, "")
    # a clear lead under 10% would read "1.0×" in one decimal: two decimals there
    return first, f"{cell.ratio:.{2 if cell.ratio < 1.1 else 1}f}×{mark}"


def legend_handles(found: "wc.WinnerMap", colors: Dict[str, str]) -> list:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=color, alpha=ALPHA, label=strategy)
               for strategy, color in colors.items()]
    if any(c.kind.projected for c in found.cells.values()):
        handles.append(Patch(facecolor="white", edgecolor=PROJECTED_EDGE, hatch=HATCH,
                             linestyle="--",
                             label="projected by commbench's cost model, not measured"))
    return handles


def _grid(ax: "Axes", found: "wc.WinnerMap", colors: Dict[str, str],
          names: Dict[str, str], font: float) -> None:
    from matplotlib.patches import Rectangle

    for y, stragglers in enumerate(found.stragglers):
        for x, network in enumerate(found.networks):
            cell = found.cells.get((stragglers, network))
            faces = [colors[e.strategy] for e in shown(cell)] if cell else []
            for i, face in enumerate(faces or [MISSING]):  # a tie: one half each
                share = 1 / max(len(faces), 1)
                ax.add_patch(Rectangle((x + i * share, y), share, 1, facecolor=face,
                                       alpha=ALPHA if faces else 1, linewidth=0))
            if cell is not None and cell.kind.projected:
                ax.add_patch(Rectangle((x + 0.04, y + 0.04), 0.92, 0.92, fill=False,
                                       hatch=HATCH, edgecolor=PROJECTED_EDGE, linestyle="--"))
            ax.add_patch(Rectangle((x, y), 1, 1, fill=False, edgecolor="white", linewidth=3))
            _write(ax, x, y, cell_text(cell, network, names), font, bool(faces))
    ax.set_xlim(0, len(found.networks))
    ax.set_ylim(len(found.stragglers), 0)
    ax.set_xticks([x + 0.5 for x in range(len(found.networks))],
                  [wc.column_name(n).replace(wc.PROJECTED_COLUMN, "\n(projected)")
                   for n in found.networks], fontsize=font * 0.9)
    ax.set_yticks([y + 0.5 for y in range(len(found.stragglers))],
                  [textwrap.fill(wc.row_name(s), 16) for s in found.stragglers],
                  fontsize=font * 0.9)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def _write(ax: "Axes", x: int, y: int, text: Tuple[str, str], font: float,
           bold: bool) -> None:
    """A cell's two texts, the large one above the small, centred as one block. Offsets
    in points, not in cells: the rows' height on the page is the layout's to settle."""
    large, small = text
    high, low = 1.25 * font, 1.25 * 0.9 * font  # a line's height
    high *= large.count("\n") + 1  # a long name wraps: the small text goes below it all
    gap = 0.3 * font if small else 0.0
    top = (high + gap + low * (small.count("\n") + 1 if small else 0)) / 2
    ax.annotate(large, (x + 0.5, y + 0.5), xytext=(0, top), textcoords="offset points",
                ha="center", va="top", fontsize=font, fontweight="bold" if bold else "normal")
    ax.annotate(small, (x + 0.5, y + 0.5), xytext=(0, top - high - gap),
                textcoords="offset points", ha="center", va="top", fontsize=0.9 * font)
