"""The winner map: which strategy did best on each network (the emulated link rate, or
real machines) and with each setting of stragglers made on purpose (--slow-ranks), at
one worker count, everything else equal.

- Runs trained to accuracy: the strategy first to the target. A row's repeats are
  combined by MLPerf Training's rule (commbench.analysis.time_to_target); its interval is
  the range (min to max) of its runs' times, and only runs that reached the target count.
- Speed runs: the strategy that moved the most images per second over all workers; its
  interval is the 95% CI of its total (over the repeats, or over one run's iterations).
- Projections (`commbench simulate`'s files, for more workers or other links than were
  measured): the most images per second the model projects, its interval the
  projection's band; every cell and title says PROJECTED.
- Beside a map of runs trained to accuracy, a projection of the same workload at the
  same worker count is a column of its own: each strategy's measured steps to the target
  (the median over the map's runs that reached it: the steps do not depend on the
  network) times the step the model projects for that link. Every such cell says
  PROJECTED; more workers would need steps to the target that were never measured.

The lead is the first's margin over the next. It is clear only where both have an
interval and the intervals do not overlap; where they overlap the cell is "too close to
call", and where either is a single run trained to accuracy (no range) the lead has no
interval and the cell says so. A cell where no strategy reached the target says that
too: ties and misses are shown, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from commbench import units
from commbench.job import straggler
from commbench.analysis import tables
from commbench.analysis import time_to_target as ttt
from commbench.errors import UsageError
from commbench.simulate.answer import RESOLUTION
from commbench.simulate.calibrate import strategy_of

CLEAR, TOO_CLOSE, SINGLE, ALONE, NONE = ("clear", "too close to call", "single runs",
                                         "the only one to reach it", "none reached it")
SHARED_MEMORY = "shared memory"
PROJECTED_COLUMN = " (projected)"  # a network's name in a column of projections


class Entry(NamedTuple):
    """One strategy in a cell: its figure, its interval (None: none to give) and the
    bytes each of its workers sent (per step for speed, to the target for accuracy);
    family: the strategy whatever the layout of machines it ran on (one colour in the
    chart across the columns), "" for the label."""

    label: str
    value: float
    interval: Optional[Tuple[float, float]]
    sent: Optional[float]
    family: str = ""

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
                "overlap)", "Bytes each worker of the first sent to the target (median)",
                ALONE)
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
        return CLEAR if apart and wide else TOO_CLOSE

    @property
    def lead(self) -> Optional[float]:
        """The first's margin over the next, in the kind's unit (None: no next)."""
        return abs(self.ranked[1].value - self.ranked[0].value) if len(self.ranked) > 1 \
            else None

    def lines(self) -> List[str]:
        """What the cell says, in short lines (the chart stacks them)."""
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

    @property
    def kinds(self) -> List[Kind]:
        """What its cells map: its own kind, then projections set beside it."""
        return [self.kind] + ([PROJECTED_TIME] if any(
            c.kind is PROJECTED_TIME for c in self.cells.values()) else [])


def maps(groups: List[Any], projections: List[Any] = ()) -> List[WinnerMap]:
    """The maps of accuracy groups (commbench.analysis.accuracy) or speed groups
    (commbench.analysis.runs): one per set of groups equal but for network and
    stragglers, and worker count, where there is more than one cell to map (a single
    cell is the tables'). The compute-only `none` is a reference, not a contender.
    Projection files of an accuracy map's workload add projected columns to it."""
    found: Dict[Tuple[Any, int], Dict[Tuple[str, str], List[Any]]] = {}
    for group in groups:
        accuracy = hasattr(group, "rows")
        if accuracy and not group.key.target:
            continue
        blank = group.key._replace(network="", stragglers="")
        for row in (group.rows if accuracy else group.points):
            if row.series.strategy == "none":  # the compute-only reference: no contender
                continue
            place = (group.key.stragglers, group.key.network)
            found.setdefault((blank, row.workers), {}).setdefault(place, []).append(row)
    out = []
    for (key, workers), places in sorted(found.items()):
        kind = ACCURACY if hasattr(key, "target") else SPEED
        entry = accuracy_entry if kind is ACCURACY else speed_entry
        cells = {place: cell_of(kind, rows, entry) for place, rows in places.items()}
        if kind is ACCURACY:
            cells.update(projected_cells(key, workers, places, projections))
        if len(cells) < 2:
            continue
        title = (f"{key.heading()}; {workers} workers; {key.details()}" if kind is ACCURACY
                 else f"{key.title()}; {workers} workers")
        out.append(WinnerMap(
            kind, title, key.slug(), key.hardware, workers,
            sorted({n for _, n in cells}, key=network_order),
            sorted({s for s, _ in cells}, key=lambda s: (s != "", s)), cells))
    return out


def projected_cells(key: Any, workers: int, places: Dict[Tuple[str, str], List[Any]],
                    projections: List[Any]) -> Dict[Tuple[str, str], Cell]:
    """Per projection file of the accuracy map's workload (model, batch, image size)
    with rows at its worker count: a PROJECTED cell whose strategies are the map's,
    each its median steps to the target times its projected step (the first steps, where
    a strategy runs them otherwise, at their own: PowerSGD's, sent whole)."""
    measured = to_target(places)
    found: Dict[Tuple[str, str], Dict[str, Entry]] = {}
    for projection in projections:
        workload = projection.doc.get("workload")
        if not workload or (workload["model"], workload["batch_size"],
                             workload["image_size"]) != (key.model, key.batch_size,
                                                         key.image_size):
            continue
        entries = found.setdefault(place_of(projection.doc), {})
        for row in projection.doc["rows"]:
            if row["workers"] != workers or row["strategy"] not in measured:
                continue
            label, family, steps, sent = measured[row["strategy"]]
            per_step = workers * key.batch_size
            first = row.get("first_steps")
            early = min(steps, first["steps"]) if first else 0  # steps unlike the rest
            before = early * per_step / first["img_sec"] if first else 0.0
            images = (steps - early) * per_step
            low, high = row["band"]
            entries.setdefault(label, Entry(label, before + images / row["img_sec"],
                                            (before + images / high, before + images / low),
                                            sent, family))
    labels = sorted({row.series.label() for rows in places.values() for row in rows})
    return {place: Cell(PROJECTED_TIME, sorted(entries.values(), key=lambda e: e.value),
                        [label for label in labels if label not in entries])
            for place, entries in found.items() if entries}


def to_target(places: Dict[Tuple[str, str], List[Any]]
              ) -> Dict[str, Tuple[str, str, float, Optional[float]]]:
    """{the strategy as `simulate` labels it: (its label here, its family, the median
    steps to the target and bytes each worker sent to it, over its runs that reached it
    in any cell)}: neither depends on the link. Its label here is the one most of its runs
    carry (the layout can add to it). Two strategies of one cell that the cost model
    does not tell apart (fp16 beside fp32 allreduce) are left out: one step time would
    be given to both."""
    runs: Dict[str, List[Any]] = {}
    labels: Dict[str, List[str]] = {}
    families: Dict[str, str] = {}
    alike = set()
    for rows in places.values():
        here: Dict[str, set] = {}
        for row in rows:
            strategy = strategy_of(row.runs[0].doc)
            if strategy is None:
                continue
            name = strategy.label()
            families[name] = family_of(row)
            here.setdefault(name, set()).add(row.series.label())
            reached = [r for r in row.runs if r.reached and r.steps]
            runs.setdefault(name, []).extend(reached)
            labels.setdefault(name, []).extend(row.series.label() for _ in reached)
        alike |= {name for name, found in here.items() if len(found) > 1}
    return {name: (max(sorted(set(labels[name])), key=labels[name].count), families[name],
                   ttt.median([r.steps for r in found]), ttt.median([r.sent for r in found]))
            for name, found in runs.items() if found and name not in alike}


def place_of(doc: Dict[str, Any]) -> Tuple[str, str]:
    """(stragglers, network) of a projection file: its --slow-ranks and --link."""
    workload = doc.get("workload") or {}
    config = doc.get("config") or {}
    slow = straggler.parse(str(workload.get("slow_ranks") or config.get("slow_ranks")
                               or "none"))
    link = workload.get("link") or config.get("link") or "fitted links"
    return (str(slow) if slow.on else "", f"{link}{PROJECTED_COLUMN}")


def projected_maps(projections: List[Any]) -> List[WinnerMap]:
    """The maps of projection files (`commbench simulate`'s, results of kind "projection"):
    one per workload and worker count whose files differ in their stated link or their
    stragglers (--link, --slow-ranks); every cell a projection, labelled as such."""
    found: Dict[Tuple[str, int], Dict[Tuple[str, str], List[Entry]]] = {}
    for projection in projections:
        doc = projection.doc
        place = place_of(doc)
        title = doc["title"]
        if place[0]:
            title = title.replace(
                f", {straggler.parse(place[0]).describe()} (stragglers on purpose)", "")
        for row in doc["rows"]:
            entries = found.setdefault((title, row["workers"]), {}).setdefault(place, [])
            entries.append(Entry(row["strategy"], row["img_sec"], tuple(row["band"]), None))
    out = []
    for (title, workers), cells in sorted(found.items()):
        if len(cells) < 2:
            continue
        out.append(WinnerMap(
            PROJECTED, f"{title}; {workers} workers", "projected", "", workers,
            sorted({n for _, n in cells}, key=network_order),
            sorted({s for s, _ in cells}, key=lambda s: (s != "", s)),
            {place: Cell(PROJECTED, sorted(entries, key=lambda e: -e.value), [])
             for place, entries in cells.items()}))
    return out


def accuracy_entry(row) -> Optional[Entry]:
    """An accuracy row (AccuracyRow) as an entry; None where it has no time."""
    time = row.combined().value
    if time is None:
        return None
    spread = ttt.spread(row.times()) if row.reached >= 2 else None
    return Entry(row.series.label(), time, spread, row.median_of("sent"), family_of(row))


def speed_entry(point) -> Optional[Entry]:
    """A speed point (runs.Point) as an entry."""
    interval = None if point.ci is None else (point.total - point.ci, point.total + point.ci)
    sent = point.sent
    return Entry(point.series.label(), point.total, interval,
                 None if sent is None else sent["bytes_per_step"], family_of(point))


def family_of(row) -> str:
    """A row's strategy without the layout of machines it ran on."""
    return row.series._replace(machines="").label()


def cell_of(kind: Kind, rows: List[Any], entry: Callable[[Any], Optional[Entry]]) -> Cell:
    entries = [(row, entry(row)) for row in rows]
    ranked = sorted((e for _, e in entries if e is not None),
                    key=lambda e: e.value if kind.lower_is_better else -e.value)
    return Cell(kind, ranked, [row.series.label() for row, e in entries if e is None])


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
