"""The projection file (kind "projection") that `commbench simulate` writes beside its
chart, never among measured results: writing one, reading its rows back, and finding
every one under some paths for `commbench report` and `commbench plot`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Tuple

from commbench.analysis.validate import MAYBE as _MAYBE
from commbench.analysis.validate import items, number, section, text, whole
from commbench.simulate.project import Inputs, Row

KIND = "projection"

# What rows_of, the tables and the charts of `report` and `plot` compute with.
FIELDS = (
    text("title"), items("notes", optional=True), items("rows"), section("rows.*"),
    text("rows.*.strategy"), whole("rows.*.workers", 1), whole("rows.*.machines", 1),
    number("rows.*.img_sec", 0, above=True), items("rows.*.band"),
    number("rows.*.band.*", 0), number("rows.*.efficiency", 0),
    section("rows.*.step"), number("rows.*.step.compute", 0), number("rows.*.step.exposed", 0),
    number("rows.*.step.overlapped", 0), number("rows.*.step.straggler_wait", 0, **_MAYBE),
    number("rows.*.step.coordination", 0, optional=True), text("rows.*.step.allreduce"),
    number("rows.*.img_sec_with_stragglers", 0, **_MAYBE), text("rows.*.basis"),
    number("rows.*.measured", 0, **_MAYBE), number("rows.*.measured_ci", 0, **_MAYBE),
    section("rows.*.first_steps", **_MAYBE),
    whole("rows.*.first_steps.steps", 1), number("rows.*.first_steps.img_sec", 0, above=True),
    # from before the workload was recorded: such a file has a map of its own only
    section("workload", optional=True), text("workload.model"),
    whole("workload.batch_size", 1), whole("workload.image_size", 1),
    text("workload.slow_ranks"), text("workload.link", nullable=True),
)


def write(out_dir: Path, args, title: str, rows: List[Row], notes: List[str],
          inputs: Inputs, files: List[str], transports: dict, workload: dict) -> Path:
    """transports: the profile of each link class
    (commbench.simulate.network_inputs.Links.record); workload: what was projected, as
    the measured runs name it (model, batch_size, image_size, slow_ranks), so a reader
    sets a projection beside the runs of the same workload."""
    from commbench.result.store import new_document, write_result

    doc = new_document(KIND)
    net = inputs.network
    doc.update(
        title=title,
        notes=notes,
        summary={"strategies": list(dict.fromkeys(r.strategy for r in rows)),
                 "workers": sorted({r.workers for r in rows}),
                 "measured_points": sum(r.measured is not None for r in rows)},
        config={k: v for k, v in vars(args).items() if k not in ("run_flags",)},
        workload=dict(workload, per_machine=inputs.per_machine),
        inputs={"files": files, "transports": transports, "gradient_bytes": inputs.gradients.total,
                "per_machine": inputs.per_machine, "algorithms": list(inputs.algorithms),
                "links": {name: link and vars(link) for name, link in
                          (("intra", net.intra), ("inter", net.inter),
                           ("exchange_intra", net.exchange_intra),
                           ("exchange_inter", net.exchange_inter))},
                "compute": {str(n): {"forward": c.forward, "backward": c.backward,
                                     "optimizer": c.optimizer, "mean_ci": c.mean_ci,
                                     "source": c.source} for n, c in inputs.compute.items()}},
        rows=[{"strategy": r.strategy, "workers": r.workers, "machines": r.machines,
               "img_sec": r.img_sec, "band": [r.low, r.high], "efficiency": r.efficiency,
               "step": {"compute": r.step.compute, "exposed": r.step.exposed,
                        "coordination": r.step.coordination,
                        "overlapped": r.step.overlapped, "straggler_wait": r.wait,
                        "allreduce": r.step.algorithm},
               "img_sec_with_stragglers": r.with_stragglers, "basis": r.basis,
               "measured": r.measured, "measured_ci": r.measured_ci,
               "first_steps": r.first_steps and {"steps": r.first_steps[0],
                                                 "img_sec": r.first_steps[1]}}
              for r in rows])
    json.dumps(doc, allow_nan=False)  # fail here, not half-written
    return write_result(out_dir, doc, f"projection-{title.split(',')[0].split()[-1]}")


def rows_of(doc) -> List[Row]:
    """The rows of a projection file, as `project` made them."""
    from commbench.simulate.step import StepTime

    return [Row(r["strategy"], r["workers"], r["machines"], r["img_sec"], *r["band"],
                r["efficiency"], StepTime(r["step"]["compute"], r["step"]["exposed"],
                                          r["step"]["overlapped"], 0.0, r["step"]["allreduce"],
                                          r["step"].get("coordination", 0.0)),
                r["img_sec_with_stragglers"], r["step"]["straggler_wait"], r["basis"],
                r["measured"], r["measured_ci"], _first_steps(r.get("first_steps")))
            for r in doc["rows"]]


def _first_steps(found) -> Optional[Tuple[int, float]]:
    return (found["steps"], found["img_sec"]) if found else None


def usable(found: List) -> Tuple[List, List[str]]:
    """The projection files found that a reader can use (commbench.result.store.Result
    objects), and one line per projection file skipped."""
    from commbench.analysis import validate

    def read(result):
        rows_of(result.doc)  # what the fields cannot say: a band of two, say
        return result

    return validate.usable(found, KIND, FIELDS, read)
