"""What `report` and `plot` read from their paths: groups of speed runs, groups of runs
trained to accuracy, microbench results and projections (commbench simulate's, shown
apart and labelled), with one warning line per file skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, List, NamedTuple, Optional, Union

from commbench.analysis import accuracy, accuracy_reading, reading
from commbench.analysis.runs import Group


class Inputs(NamedTuple):
    groups: List[Group]
    accuracy: List[accuracy.AccuracyGroup]
    benches: List[Any]
    projections: List[Any]


def load_for(command: str, paths: Iterable[Union[str, Path]], err) -> Optional[Inputs]:
    """Everything usable under paths, the warnings on err; None, after saying so, when
    nothing usable was found."""
    from commbench.microbench import results as microbench_results
    from commbench.simulate import projection_file as simulate

    paths = list(paths)
    groups, notes = reading.analyse(
        paths, handled=(microbench_results.KIND, simulate.KIND, accuracy_reading.KIND))
    trained, more = accuracy_reading.load(paths)
    benches, bench_notes = microbench_results.load(paths)  # their own tables and charts
    projections, projection_notes = simulate.load(paths)
    for note in notes + more + bench_notes + projection_notes:
        print(f"commbench {command}: warning: {note}", file=err)
    found = Inputs(groups, accuracy.group(trained), benches, projections)
    if not any(found):
        print(f"commbench {command}: error: no usable commbench run results in "
              f"{', '.join(map(str, paths))}", file=err)
        return None
    return found
