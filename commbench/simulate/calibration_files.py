"""The measured files a projection is calibrated on: run and microbench result files
read with the fields calibration needs of them, and what those fields cannot say
checked before it computes with them; a file that fails is passed over with a note
that says why, as `report` passes over files it cannot read."""

from __future__ import annotations

from typing import List, Tuple

from commbench.analysis import reader, reading, validate
from commbench.analysis.reading import RUN_FIELDS
from commbench.analysis.validate import MAYBE, SECONDS_FLOOR, items, number, text, whole
from commbench.microbench import results as microbench_results
from commbench.simulate import projection_file


def _nested(path: str, depth: int, low: float) -> Tuple[validate.Field, ...]:
    """A list of lists (depth deep) of finite numbers >= low, or absent or null."""
    lists = tuple(items(path + ".*" * i, **(MAYBE if i == 0 else {})) for i in range(depth))
    return lists + (number(path + ".*" * depth, low),)


# What calibration reads of a run besides what read_run does (RUN_FIELDS): the
# strategy and its settings, the layout, and the compute-only reference.
CALIBRATION_FIELDS = RUN_FIELDS + (
    text("config.dist_optimizer"), text("config.topology", **MAYBE),
    whole("environment.local_size", 1, **MAYBE), whole("environment.world_size", 1, **MAYBE),
    *_nested("samples.reference_batch_seconds", 3, SECONDS_FLOOR),  # [rank][iter][batch]
    *_nested("samples.reference_phase_seconds", 3, 0),  # [rank][batch][phase]
    number("samples.batch_seconds.*.*.*", SECONDS_FLOOR),  # a `none` run's compute
)


def check_run(doc: dict) -> None:
    """What CALIBRATION_FIELDS cannot say of a run: each row of its reference's phases
    is (forward, backward, optimizer), not all 0, and its topology is one commbench
    builds. Raises validate.Invalid naming the field."""
    phases = (doc.get("samples") or {}).get("reference_phase_seconds") or []
    for i, rank in enumerate(phases):
        for j, row in enumerate(rank):
            if len(row) != 3:
                raise validate.Invalid(f"samples.reference_phase_seconds[{i}][{j}]",
                                       f"holds {len(row)} numbers, not 3 (forward, "
                                       "backward, optimizer)")
    if any(phases) and not sum(v for rank in phases for row in rank for v in row) > 0:
        raise validate.Invalid("samples.reference_phase_seconds", "is all 0")
    _check_topology(doc)


def check_microbench(doc: dict) -> None:
    """What a microbench file's fields cannot say of the links fitted from it: its
    topology is one commbench builds, and its machines hold its ranks evenly."""
    _check_topology(doc)
    hosts = (doc.get("environment") or {}).get("hostnames") or []
    machines, ranks = len(set(hosts)), doc["summary"]["world_size"]
    if machines > 1 and ranks % machines:
        raise validate.Invalid("environment.hostnames", f"names {machines} machines, which "
                               f"do not hold {ranks} ranks (summary.world_size) evenly")


def _check_topology(doc: dict) -> None:
    from commbench.topology import TopologyError
    from commbench.topology.graphs import parse_name

    name = doc["config"].get("topology")
    try:
        if name is not None:
            parse_name(name)
    except TopologyError:
        raise validate.Invalid("config.topology", f"is {validate.shown(name)}, not a "
                               "topology commbench builds") from None


def read(paths: List[str]) -> Tuple[list, list, List[str]]:
    """The run files and microbench files under paths that calibration can use, and the
    notes on those it passed over; projections and runs trained to accuracy are no
    measurement to calibrate on."""
    read_in, notes = reader.read(paths, {
        reading.KIND: lambda found: reading.usable(found, CALIBRATION_FIELDS, check_run),
        microbench_results.KIND: lambda found: microbench_results.usable(
            found, check_microbench),
        projection_file.KIND: reader.passed_over, "accuracy": reader.passed_over})
    return read_in[reading.KIND], read_in[microbench_results.KIND], notes
