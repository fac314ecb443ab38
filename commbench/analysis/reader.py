"""The one reader of result files for `report`, `plot` and `compare`: the files are
read once (commbench.result.store), and each result is checked and made into its kind's
model by that kind's reader, listed in KINDS. Speed runs and runs trained to accuracy
differ only in their fields, their groups' keys, their tables and their charts;
microbench results and projections (commbench simulate's, shown apart and labelled)
are kept as read. One warning line per file skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

from commbench.analysis import accuracy, accuracy_reading, reading
from commbench.analysis.grouping import group_runs
from commbench.analysis.runs import Group
from commbench.result.store import Result, load_results


Reader = Callable[[List[Result]], Tuple[List[Any], List[str]]]


def kinds() -> Dict[str, Reader]:
    """Each kind's reader: its results -> what it reads them into, and one line per
    result it skips."""
    from commbench.microbench import results as microbench_results
    from commbench.simulate import projection_file

    return {reading.KIND: reading.usable, accuracy_reading.KIND: accuracy_reading.usable,
            microbench_results.KIND: microbench_results.usable,
            projection_file.KIND: projection_file.usable}


def passed_over(found: List[Result]) -> Tuple[List[Any], List[str]]:
    """The reader of a kind a command knows but does not use: it reads nothing and
    says nothing."""
    return [], []


def read(paths: Iterable[Union[str, Path]], readers: Optional[Dict[str, Reader]] = None
         ) -> Tuple[Dict[str, List[Any]], List[str]]:
    """What each reader (of every kind, unless given) made of the results under paths,
    by kind, and one line per file skipped."""
    readers = readers or kinds()
    results, notes = load_results(paths)
    found: Dict[str, List[Result]] = {kind: [] for kind in readers}
    for result in results:
        if result.kind in found:
            found[result.kind].append(result)
        else:
            names = " or ".join(repr(k) for k in readers if readers[k] is not passed_over)
            notes.append(f"skipping {result.path}: a {result.kind!r} result; only {names} "
                         "results are analysed here")
    read_in = {}
    for kind, reader in readers.items():
        read_in[kind], more = reader(found[kind])
        notes += more
    return read_in, notes


def load_runs(paths: Iterable[Union[str, Path]]) -> Tuple[List[Any], List[str]]:
    """The speed runs under paths, and one line per file skipped."""
    read_in, notes = read(paths, {reading.KIND: reading.usable})
    return read_in[reading.KIND], notes


def analyse(paths: Iterable[Union[str, Path]]) -> Tuple[List[Group], List[str]]:
    """The speed runs under paths in their groups, and one line per file skipped."""
    runs, notes = load_runs(paths)
    return group_runs(runs), notes


class Inputs(NamedTuple):
    groups: List[Group]
    accuracy: List[accuracy.AccuracyGroup]
    benches: List[Any]
    projections: List[Any]


def load_for(command: str, paths: Iterable[Union[str, Path]], err) -> Optional[Inputs]:
    """Everything usable under paths, grouped, the warnings on err; None, after saying
    so, when nothing usable was found."""
    paths = list(paths)
    read_in, notes = read(paths)
    for note in notes:
        print(f"commbench {command}: warning: {note}", file=err)
    found = Inputs(group_runs(read_in["run"]), accuracy.group(read_in["accuracy"]),
                   read_in["microbench"], read_in["projection"])
    if not any(found):
        print(f"commbench {command}: error: no usable commbench run results in "
              f"{', '.join(map(str, paths))}", file=err)
        return None
    return found
