"""The winner map of runs trained to accuracy: which strategy reached the target first
on each network (the emulated link rate, or real machines) and with each setting of
stragglers made on purpose (--slow-ranks), at one worker count, everything else equal.

A cell's rows are the strategies run there, their repeats combined by MLPerf Training's
rule (commbench.analysis.time_to_target). The first is the row of least time; its lead is
the next row's time less its own. The lead is clear only where both rows have several
runs that reached the target and the ranges of their times (min to max) do not overlap;
where they overlap the cell is "too close to call", and where either is a single run the
lead has no interval and the cell says so. A cell where no strategy reached the target
says that too: ties and misses are shown, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from commbench import straggler, units
from commbench.analysis import tables
from commbench.analysis import time_to_target as ttt
from commbench.analysis.accuracy import AccuracyGroup, AccuracyKey, AccuracyRow
from commbench.errors import UsageError

CLEAR, TOO_CLOSE, SINGLE, ALONE, NONE = ("clear", "too close to call", "single runs",
                                         "the only one to reach it", "none reached it")
SHARED_MEMORY = "shared memory"


@dataclass
class Cell:
    """The strategies of one network and stragglers setting, fastest first."""

    ranked: List[Tuple[AccuracyRow, float]]  # rows that reached, with their times
    missed: List[AccuracyRow]  # rows without a time (not reached, or invalid)

    @property
    def verdict(self) -> str:
        if not self.ranked:
            return NONE
        if len(self.ranked) == 1:
            return ALONE
        (first, _), (second, _) = self.ranked[:2]
        if min(first.reached, second.reached) < 2:
            return SINGLE
        return CLEAR if ttt.spread(first.times())[1] < ttt.spread(second.times())[0] \
            else TOO_CLOSE

    @property
    def lead(self) -> Optional[float]:
        """Seconds the first reached the target before the next (None: no next)."""
        return self.ranked[1][1] - self.ranked[0][1] if len(self.ranked) > 1 else None

    def lines(self) -> List[str]:
        """What the cell says, in short lines (the chart stacks them)."""
        if not self.ranked:
            return [NONE]
        first = self.ranked[0][0].series.label()
        if self.verdict == ALONE:
            return [first, f"({ALONE})"]
        second = self.ranked[1][0].series.label()
        if self.verdict == TOO_CLOSE:
            return [f"{TOO_CLOSE}:", first, f"~ {second} ({self.lead:.1f} s)"]
        single = ["(single runs: no interval)"] if self.verdict == SINGLE else []
        return [first, f"by {self.lead:.1f} s over", second] + single

    def text(self) -> str:
        return " ".join(self.lines())

    def bytes_text(self) -> str:
        """The first's median bytes each worker sent to the target."""
        if not self.ranked:
            return "-"
        sent = self.ranked[0][0].median_of("sent")
        return "-" if sent is None else units.format_bytes(sent)


@dataclass
class WinnerMap:
    key: AccuracyKey  # the groups' key, network and stragglers blanked
    workers: int
    networks: List[str]
    stragglers: List[str]
    cells: Dict[Tuple[str, str], Cell]  # (stragglers, network) -> its cell

    def title(self) -> str:
        return f"{self.key.heading()}; {self.workers} workers; {self.key.details()}"


def maps(groups: List[AccuracyGroup]) -> List[WinnerMap]:
    """One map per set of groups equal but for network and stragglers, and worker count,
    where there is more than one cell to map (a single cell is the accuracy table's)."""
    found: Dict[Tuple[AccuracyKey, int], Dict[Tuple[str, str], List[AccuracyRow]]] = {}
    for group in groups:
        if not group.key.target:
            continue
        blank = group.key._replace(network="", stragglers="")
        for row in group.rows:
            cell = (group.key.stragglers, group.key.network)
            found.setdefault((blank, row.workers), {}).setdefault(cell, []).append(row)
    out = []
    for (key, workers), cells in sorted(found.items()):
        if len(cells) < 2:
            continue
        networks = sorted({n for _, n in cells}, key=network_order)
        stragglers = sorted({s for s, _ in cells}, key=lambda s: (s != "", s))
        out.append(WinnerMap(key, workers, networks, stragglers,
                             {place: cell_of(rows) for place, rows in cells.items()}))
    return out


def cell_of(rows: List[AccuracyRow]) -> Cell:
    timed = [(row, row.combined().value) for row in rows]
    ranked = sorted(((row, t) for row, t in timed if t is not None), key=lambda rt: rt[1])
    return Cell(ranked, [row for row, t in timed if t is None])


def network_order(network: str) -> Tuple[int, float, str]:
    """Slowest link first (by the cluster's rate; uneven links after even ones of the
    same rate), shared memory (no emulated network) last."""
    if not network:
        return (1, 0.0, network)
    try:
        return (0, units.rate_bits(network.split(" ")[0]), network)
    except UsageError:  # a rate this version cannot read: after the ones it can
        return (0, float("inf"), network)


def column_name(network: str) -> str:
    return network or SHARED_MEMORY


def row_name(stragglers: str) -> str:
    return straggler.parse(stragglers).describe() if stragglers else "no straggler"


def render(groups: List[AccuracyGroup], fmt: str = "text") -> str:
    """The maps as tables (text or Markdown): the first to the target in each cell, then
    the bytes it sent; "" where there is no map (and for JSON and CSV, whose accuracy
    rows carry what the map is drawn from)."""
    if fmt in ("json", "csv"):
        return ""
    parts = []
    for found in maps(groups):
        headers = ["stragglers \\ network"] + [column_name(n) for n in found.networks]
        align = "l" * len(headers)

        def rows(text_of):
            return [[row_name(s)] + [text_of(found.cells[(s, n)]) if (s, n) in found.cells
                                     else "not run" for n in found.networks]
                    for s in found.stragglers]

        parts.append(f"{tables.heading('Winner map: ' + found.title(), fmt)}\n\n"
                     "First to the target (time to target by MLPerf Training's rule; the "
                     "lead is clear where the runs' min-max ranges do not overlap):\n\n"
                     + tables.render(headers, rows(Cell.text), align, fmt)
                     + "\nBytes each worker sent to the target, the first's (median):\n\n"
                     + tables.render(headers, rows(Cell.bytes_text), align, fmt))
    return "\n".join(parts)
