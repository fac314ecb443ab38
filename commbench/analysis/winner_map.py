"""The winner map: which strategy did best on each network (the emulated link rate, or
real machines) and with each setting of stragglers made on purpose (--slow-ranks), at
one worker count, everything else equal. The cells and their verdicts are
commbench.analysis.winner_cells'; the projected columns and maps winner_projection's;
`report`'s table winner_table's; the chart commbench.plots.winner_map's.

- Runs trained to accuracy: the strategy first to the target. A row's repeats are
  combined by MLPerf Training's rule (commbench.analysis.time_to_target); its interval is
  the range (min to max) of its runs' times, and only runs that reached the target count;
  each run's time by its seed, for the comparison paired by seed.
- Speed runs: the strategy that moved the most images per second over all workers; its
  interval is the 95% CI of its total (over the repeats, or over one run's iterations).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from commbench.analysis import time_to_target as ttt
from commbench.analysis.winner_cells import (ACCURACY, SPEED, Entry, WinnerMap, cell_of,
                                             family_of)
from commbench.analysis.winner_projection import projected_cells


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
        details = key.details() if kind is ACCURACY else ""
        heading = f"{key.heading() if kind is ACCURACY else key.title()}; {workers} workers"
        title = f"{heading}; {details}" if details else heading
        out.append(WinnerMap.of(kind, title, key.slug(), key.hardware, workers, cells,
                                details))
    return out


def accuracy_entry(row) -> Optional[Entry]:
    """An accuracy row (AccuracyRow) as an entry; None where it has no time."""
    time = row.combined().value
    if time is None:
        return None
    spread = ttt.spread(row.times()) if row.reached >= 2 else None
    seeds = [r.seed for r in row.runs]
    by_seed = () if None in seeds or len(set(seeds)) < len(seeds) else tuple(
        (r.seed, r.time if r.reached else None) for r in row.runs)
    return Entry(row.series.label(), time, spread, row.median_of("sent"), family_of(row),
                 by_seed)


def speed_entry(point) -> Optional[Entry]:
    """A speed point (runs.Point) as an entry."""
    interval = None if point.ci is None else (point.total - point.ci, point.total + point.ci)
    sent = point.sent
    return Entry(point.series.label(), point.total, interval,
                 None if sent is None else sent["bytes_per_step"], family_of(point))
