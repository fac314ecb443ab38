"""What a winner map is made of (commbench.analysis.winner_map builds it): what is mapped
(a Kind), one strategy's figure in a cell (an Entry), a cell of strategies best first (a
Cell, with its verdict and lead) and the map (a WinnerMap), and how its rows and
columns are named and ordered. The text table (winner_table) and the chart
(commbench.plots.winner_map) both read these.

The lead is the first's margin over the next. It is clear where both have an
interval and the intervals do not overlap. Runs trained to accuracy at the same seeds
are also compared seed by seed (the seed draws the task itself, so its spread is not the
strategies'): the lead is clear "paired by seed" where the 95% CI of the geometric mean
of the next's time over the first's, at the seeds where both reached the target, stays
above 1. Elsewhere the cell is "too close to call"; where either is a single run trained
to accuracy (no range) the lead has no interval and the cell says so. A cell where no
strategy reached the target says that too: ties and misses are shown, never hidden.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from commbench import units
from commbench.result.metrics import paired_interval
from commbench.job import straggler
from commbench.errors import UsageError
from commbench.simulate.answer import RESOLUTION

CLEAR, PAIRED, TOO_CLOSE, SINGLE, ALONE, NONE = (
    "clear", "clear paired by seed", "too close to call", "single runs",
    "the only one to reach it", "none reached it")
SHARED_MEMORY = "shared memory"
PAIRED_SEEDS = 3  # the fewest seeds a lead paired by seed rests on, as MLPerf's rule asks
PROJECTED_COLUMN = " (projected)"  # a network's name in a column of projections


class Entry(NamedTuple):
    """One strategy in a cell: its figure, its interval (None: none to give) and the
    bytes each of its workers sent (per step for speed, to the target for accuracy);
    family: the strategy whatever the layout of machines it ran on (one colour in the
    chart across the columns), "" for the label; by_seed: (seed, figure) of each run,
    None where it has none (not reached), where every run's seed is its own (else empty:
    nothing to pair)."""

    label: str
    value: float
    interval: Optional[Tuple[float, float]]
    sent: Optional[float]
    family: str = ""
    by_seed: Tuple[Tuple[int, Optional[float]], ...] = ()

    @property
    def strategy(self) -> str:
        return self.family or self.label


@dataclass(frozen=True)
class Kind:
    """What is mapped: how entries are ordered and how their figures read."""

    name: str  # "accuracy" or "speed"
    lower_is_better: bool
    unit: str
    what: str  # the map's heading: what the first did
    sent: str  # what the bytes panel gives
    alone: str  # what a cell with one entry says of it
    resolution: float = 0.0  # a relative lead below this is too close to call
    projected: bool = False  # by commbench's cost model, not measured


ACCURACY = Kind("accuracy", True, "s", "First to the target (time to target by MLPerf "
                "Training's rule; the lead is clear where the runs' min-max ranges do not "
                "overlap, or where, paired by seed, the 95% CI of the next's time over the "
                "first's stays above 1)",
                "Bytes each worker of the first sent to the target (median)", ALONE)
SPEED = Kind("speed", False, "img/s", "Most images per second over all workers (the lead "
             "is clear where the 95% intervals do not overlap)",
             "Bytes each worker of the first sent per step", "the only one measured")
PROJECTED = Kind("projection", False, "img/s", "PROJECTED: most images per second over all "
                 "workers by commbench's cost model, not a measurement (the lead is clear "
                 "where the projections' bands do not overlap and they differ by at least "
                 f"{100 * RESOLUTION:.0f}%, the model's own error, as `simulate` calls it)",
                 "", "the only one projected", RESOLUTION, projected=True)
PROJECTED_TIME = Kind("projected time to target", True, "s", "PROJECTED, in the columns so "
                      "marked: time to the target as each strategy's measured steps to it "
                      "times the step commbench's cost model projects on that link, not a "
                      "measurement (clear where the bands do not overlap and differ by at "
                      f"least {100 * RESOLUTION:.0f}%)", "", "the only one projected",
                      RESOLUTION, projected=True)


@dataclass
class Cell:
    """The strategies of one network and stragglers setting, best first."""

    kind: Kind
    ranked: List[Entry]
    missed: List[str]  # strategies without a figure (not reached, or invalid)

    @property
    def verdict(self) -> str:
        if not self.ranked:
            return NONE
        if len(self.ranked) == 1:
            return ALONE
        first, second = self.ranked[:2]
        if first.interval is None or second.interval is None:
            return SINGLE
        (low, high), (other_low, other_high) = first.interval, second.interval
        apart = high < other_low if self.kind.lower_is_better else low > other_high
        wide = abs(first.value - second.value) >= self.kind.resolution * second.value
        if apart and wide:
            return CLEAR
        paired = self.paired
        return PAIRED if paired and paired[1] > 1.0 and wide else TOO_CLOSE

    @property
    def paired(self) -> Optional[Tuple[float, float, float, int]]:
        """The next's figure over the first's (lower is better; the first's over the
        next's else) at the seeds where both have one: (geometric mean, its 95% CI low
        and high, seeds); None below PAIRED_SEEDS such seeds, or where the next has a
        figure at a seed where the first has none (it did better there)."""
        if len(self.ranked) < 2:
            return None
        first, second = (dict(e.by_seed) for e in self.ranked[:2])
        if any(first[s] is None and second[s] is not None for s in set(first) & set(second)):
            return None
        seeds = sorted(s for s in set(first) & set(second)
                       if first[s] is not None and second[s] is not None)
        if len(seeds) < PAIRED_SEEDS or any(first[s] <= 0 or second[s] <= 0 for s in seeds):
            return None
        ratios = [second[s] / first[s] if self.kind.lower_is_better else first[s] / second[s]
                  for s in seeds]
        low, high = paired_interval(ratios)
        return math.sqrt(low * high), low, high, len(seeds)

    @property
    def lead(self) -> Optional[float]:
        """The first's margin over the next, in the kind's unit (None: no next)."""
        return abs(self.ranked[1].value - self.ranked[0].value) if len(self.ranked) > 1 \
            else None

    @property
    def ratio(self) -> Optional[float]:
        """The first's lead as a factor, at least 1: the next's time over the first's, or
        the first's rate over the next's (None: no next, or a figure of 0)."""
        if len(self.ranked) < 2 or not self.ranked[0].value or not self.ranked[1].value:
            return None
        first, second = self.ranked[0].value, self.ranked[1].value
        return second / first if self.kind.lower_is_better else first / second

    def lines(self) -> List[str]:
        """What the cell says, in short lines (the text table joins them)."""
        source = ["PROJECTED"] if self.kind.projected else []
        if not self.ranked:
            return source + [NONE]
        first = self.ranked[0].label
        if self.verdict == ALONE:
            return source + [first, f"({self.kind.alone})"]
        second, lead = self.ranked[1].label, f"{self.lead:.1f} {self.kind.unit}"
        if self.verdict == TOO_CLOSE:
            return source + [f"{TOO_CLOSE}:", first, f"~ {second} ({lead})"]
        single = ["(single runs: no interval)"] if self.verdict == SINGLE else []
        if self.verdict == PAIRED:
            mean, low, high, seeds = self.paired
            single = [f"(paired by seed: {mean:.2f}x, 95% CI {low:.2f}-{high:.2f}x, "
                      f"{seeds} seeds)"]
        return source + [first, f"by {lead} over", second] + single

    def text(self) -> str:
        return " ".join(self.lines())

    def bytes_text(self) -> str:
        """What the first's workers sent (Kind.sent)."""
        if not self.ranked or self.ranked[0].sent is None:
            return "-"
        return units.format_bytes(self.ranked[0].sent)


@dataclass
class WinnerMap:
    kind: Kind
    title: str
    slug: str
    hardware: str
    workers: int
    networks: List[str]
    stragglers: List[str]
    cells: Dict[Tuple[str, str], Cell]  # (stragglers, network) -> its cell
    details: str = ""  # the end of the title that the chart prints small

    @classmethod
    def of(cls, kind: Kind, title: str, slug: str, hardware: str, workers: int,
           cells: Dict[Tuple[str, str], Cell], details: str = "") -> "WinnerMap":
        """The map of these cells: the slowest network first, no straggler first."""
        return cls(kind, title, slug, hardware, workers,
                   sorted({n for _, n in cells}, key=network_order),
                   sorted({s for s, _ in cells}, key=lambda s: (s != "", s)), cells, details)

    @property
    def heading(self) -> str:
        """The title without its details: what the chart prints large."""
        return self.title.removesuffix(f"; {self.details}") if self.details else self.title

    @property
    def kinds(self) -> List[Kind]:
        """What its cells map: its own kind, then projections set beside it."""
        return [self.kind] + ([PROJECTED_TIME] if any(
            c.kind is PROJECTED_TIME for c in self.cells.values()) else [])


def cell_of(kind: Kind, rows: List[Any], entry: Callable[[Any], Optional[Entry]]) -> Cell:
    entries = [(row, entry(row)) for row in rows]
    ranked = sorted((e for _, e in entries if e is not None),
                    key=lambda e: e.value if kind.lower_is_better else -e.value)
    return Cell(kind, ranked, [row.series.label() for row, e in entries if e is None])


def family_of(row) -> str:
    """A row's strategy without the layout of machines it ran on."""
    return row.series._replace(machines="").label()


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


def unfilled(network: str) -> str:
    """What a cell with neither runs nor a projection says."""
    return "not projected" if network.endswith(PROJECTED_COLUMN) else "not run"


def row_name(stragglers: str) -> str:
    return straggler.parse(stragglers).describe() if stragglers else "no straggler"
