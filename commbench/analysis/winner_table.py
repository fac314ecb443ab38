"""`report`'s winner maps (commbench.analysis.winner_map) as tables, text or Markdown:
each cell names the first, its lead and the next, or says it is too close to call;
then the bytes the first sent. The ranges, bytes and steps the chart leaves out are
here."""

from __future__ import annotations

from typing import Any, List

from commbench.analysis import tables
from commbench.analysis.winner_cells import PROJECTED, Cell, WinnerMap, column_name, row_name, \
    unfilled
from commbench.analysis.winner_map import maps
from commbench.analysis.winner_projection import projected_maps


def render(groups: List[Any], fmt: str = "text", projections: List[Any] = ()) -> str:
    """The maps as tables (text or Markdown): the best in each cell, then the bytes it
    sent; "" where there is no map (and for JSON and CSV, whose rows carry what the map
    is drawn from)."""
    return render_maps(maps(groups, projections), fmt)


def render_projected(projections: List[Any], fmt: str = "text") -> str:
    """The maps of projection files as tables, each titled as a projection."""
    return render_maps(projected_maps(projections), fmt)


def render_maps(found_maps: List[WinnerMap], fmt: str) -> str:
    if fmt in ("json", "csv"):
        return ""
    parts = []
    for found in found_maps:
        headers = ["stragglers \\ network"] + [column_name(n) for n in found.networks]
        align = "l" * len(headers)

        def rows(text_of):
            return [[row_name(s)] + [text_of(found.cells[(s, n)]) if (s, n) in found.cells
                                     else unfilled(n) for n in found.networks]
                    for s in found.stragglers]

        heading = ("PROJECTED winner map: " if found.kind is PROJECTED else "Winner map: ")
        parts.append(f"{tables.heading(heading + found.title, fmt)}\n\n"
                     + "".join(f"{kind.what}:\n\n" for kind in found.kinds)
                     + tables.render(headers, rows(Cell.text), align, fmt)
                     + (f"\n{found.kind.sent}:\n\n"
                        + tables.render(headers, rows(Cell.bytes_text), align, fmt)
                        if found.kind.sent else ""))
    return "\n".join(parts)
