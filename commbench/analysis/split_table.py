"""`report`'s table of where a step's time goes, per row of a speed or accuracy table
whose runs recorded their step split (commbench.timing.step_split): compute, the codec,
exposed communication, waiting, injected delay, and what each worker sent per step."""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

from commbench import units
from commbench.analysis import tables
from commbench.analysis.runs import ResultRun, Series

PARTS = ("step", "compute", "codec", "exposed", "waiting", "injected", "other", "overlapped")
HEADERS = ["strategy", "topology", "N", "step ms", "compute", "codec", "exposed", "waiting",
           "injected", "other", "hidden", "sent/step"]
TITLE = ("Where a step's time goes, ms per step (mean over ranks, steps and runs): "
         "compute + codec + exposed + waiting + injected + other = step; codec: "
         "compressing and decompressing messages; injected: stragglers made on purpose "
         "(--slow-ranks); hidden: communication overlapped with compute; sent/step: "
         "bytes each worker put on the wire per step (binary units); '-': not measured")

# One row: its series, worker count, mean split (seconds per part), wire summary, and
# what else sets it apart in its table (its failures, say; "" for nothing).
Row = Tuple[Series, int, Optional[Dict[str, float]], Optional[Dict[str, float]], str]


def render(rows: Iterable[Row], fmt: str) -> str:
    cells: List[List[str]] = []
    for series, workers, split, wire, apart in rows:
        topology = ", ".join(p for p in (series.settings(), apart) if p) or "-"
        cells.append([series.strategy, topology, str(workers)] + (
            ["-"] * len(PARTS) if split is None else
            [f"{1e3 * split[part]:.1f}" if part in split else "-" for part in PARTS])
            + ["-" if wire is None or wire.get("bytes_per_step") is None
               else units.format_bytes(wire["bytes_per_step"])])
    return f"\n{TITLE}\n\n" + tables.render(HEADERS, cells, "ll" + "r" * 10, fmt)


def unrecorded_lines(runs: Iterable[Tuple[Series, int, ResultRun]]) -> List[str]:
    """One line per run (with its row's series and worker count) whose strategy
    communicated but counted no byte: its sent/step of 0 is not what it sent."""
    return [f"No bytes on the wire recorded: {series.label()}, N={workers}, {run.path}: "
            "its strategy communicates but counted none (docs/plugins.md, \"Bytes on the "
            "wire\"); its 0 bytes are not what it sent"
            for series, workers, run in runs if run.wire_unrecorded]
