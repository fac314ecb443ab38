"""The winner map's projections (`commbench simulate`'s files, for more workers or other
links than were measured): a map of projection files alone, and the projected columns
set beside a map of runs trained to accuracy (commbench.analysis.winner_map).

- A map of projections: the most images per second the model projects, its interval the
  projection's band; every cell and title says PROJECTED.
- Beside a map of runs trained to accuracy, a projection of the same workload at the
  same worker count is a column of its own: each strategy's measured steps to the target
  (the median over the map's runs that reached it: the steps do not depend on the
  network) times the step the model projects for that link. Every such cell says
  PROJECTED; more workers would need steps to the target that were never measured.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from commbench.job import straggler
from commbench.analysis import time_to_target as ttt
from commbench.analysis.winner_cells import (PROJECTED, PROJECTED_COLUMN, PROJECTED_TIME, Cell,
                                             Entry, WinnerMap, family_of)
from commbench.simulate.calibrate import strategy_of


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
    return [WinnerMap.of(PROJECTED, f"{title}; {workers} workers", "projected", "", workers,
                         {place: Cell(PROJECTED, sorted(entries, key=lambda e: -e.value), [])
                          for place, entries in cells.items()})
            for (title, workers), cells in sorted(found.items()) if len(cells) >= 2]
