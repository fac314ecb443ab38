"""`report`'s tables of runs trained to accuracy: per group, one row per strategy and
worker count with its repeats combined (MLPerf Training's rule, or the median where
there are too few runs, flagged), as text, Markdown, CSV or JSON."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from commbench.analysis import split_table, tables
from commbench.analysis import time_to_target as ttt
from commbench.analysis.accuracy import AccuracyGroup, AccuracyKey, AccuracyRow, AccuracyRun
from commbench import units
from commbench.result.store import to_json

HEADERS = ["strategy", "topology", "N", "runs", "reached", "time s", "by", "median s",
           "min-max s", "steps", "epochs", "sent", "best if missed", "img/sec",
           "not to be trusted"]
ALIGN = "llrrrrlrrrrrrrl"

NOTES = [
    "Time to accuracy: training time (the clock paused for evaluation) until the "
    "averaged model first reaches the target at an evaluation. A run that did not reach "
    "it has no time; ordered by time, it counts as slower than every run that did.",
    "time s: a row's runs combined by MLPerf Training's rule (training_rules.adoc, "
    "Benchmark Results): drop the fastest and the slowest run, mean of the rest; one run "
    "that missed the target is the slowest and is dropped, two or more make the result "
    f"invalid (no time). With fewer than {ttt.OLYMPIC_MIN_RUNS} runs the rule cannot "
    f"drop both ends: the median is given instead, marked 'median (<{ttt.OLYMPIC_MIN_RUNS} "
    "runs)'. MLPerf asks for 5 to 10 runs per benchmark; commbench applies the rule from "
    f"{ttt.OLYMPIC_MIN_RUNS}.",
    "median s, steps, epochs, sent: medians to the target over all the row's runs (none "
    "when the median falls on a run that missed it); min-max s: over the runs that reached "
    "it. sent: bytes each worker put on the wire to the target (binary units; none for "
    "runs that did not record them, such as an engine's).",
    "reached: runs that reached the target / runs. best if missed: the best accuracy of "
    "the averaged model among runs that missed it. img/sec: total over the workers during "
    "training, mean over the runs. The JSON and CSV also give the wall time to the target "
    "(evaluation included, as MLPerf counts it), combined by the same rule.",
    "not to be trusted: same-seed, runs of the row share a seed (their spread is the "
    "machine's, not the training's); oversubscribed, more workers on a machine than "
    "physical cores.",
]

# Said besides of a language model's groups, whose target is a loss (issue #55).
LOSS_NOTE = (
    "Time to target loss (a language model's groups): the same, until the averaged "
    "model's validation loss, in nats per token, is first at most the target; best if "
    "missed: the lowest such loss among runs that missed it; tokens/sec: tokens, not "
    "images. The JSON's and CSV's best_accuracy_missed is the next-token accuracy.")

# Raw numbers of one row, for --format csv and json.
ROW_FIELDS = tables.row_fields(
    "reached", "target", "time_to_target_s", "rule", "rule_detail", "median_time_to_target_s",
    "min_time_to_target_s", "max_time_to_target_s", "wall_time_to_target_s", "wall_rule",
    "median_wall_time_to_target_s", "median_steps_to_target", "median_epochs_to_target",
    "median_bytes_to_target", "best_accuracy_missed", "img_sec", "seeds")
KEY_COLUMNS = list(AccuracyKey._fields)
# The CSV's columns after the group's: the row's, less what the group's already give
# (the target), so that no column name appears twice.
CSV_ROW_FIELDS = [c for c in ROW_FIELDS if c not in KEY_COLUMNS]


def render(groups: List[AccuracyGroup], fmt: str = "text") -> str:
    if fmt == "json":
        return to_json({"accuracy_groups": [group_record(g) for g in groups]},
                       indent=1) + "\n"
    if fmt == "csv":
        rows = [[g.key._asdict()[c] for c in KEY_COLUMNS] + [r[c] for c in CSV_ROW_FIELDS]
                for g in groups for r in map(row_record, g.rows)]
        return tables.csv_text(KEY_COLUMNS + CSV_ROW_FIELDS, rows)
    parts = []
    for g in groups:
        headers = [h.replace("img/sec", "tokens/sec") for h in HEADERS] if g.key.by_loss \
            else HEADERS
        table = tables.render(headers, [formatted_row(r) for r in g.rows], ALIGN, fmt)
        title = "Time to target loss: " if g.key.by_loss else "Time to accuracy: "
        heading = tables.heading(title + g.key.heading(), fmt)
        parts.append(f"{heading}\n\n{g.key.details()[0].upper()}{g.key.details()[1:]}."
                     f"\n\n{table}")
        diverged = [(row, run) for row in g.rows for run in row.runs if run.diverged is not None]
        if diverged:
            parts.append(tables.lines([diverged_line(row, run) for row, run in diverged], fmt))
        restarted = [recovery_line(row, run, headers[HEADERS.index("img/sec")])
                     for row in g.rows for run in row.runs if run.recovery is not None]
        if restarted:
            parts.append(tables.lines(restarted, fmt))
        unrecorded = split_table.unrecorded_lines(
            (row.series, row.workers, run) for row in g.rows for run in row.runs)
        if unrecorded:
            parts.append(tables.lines(unrecorded, fmt))
        if any(row.split is not None for row in g.rows):
            parts.append(split_table.render(
                [(r.series, r.workers, r.split, r.wire, r.failures) for r in g.rows], fmt))
    notes = NOTES + [LOSS_NOTE] if any(g.key.by_loss for g in groups) else NOTES
    return "\n".join(parts) + "\n" + tables.notes(notes, fmt)


def diverged_line(row: AccuracyRow, run: AccuracyRun) -> str:
    """A run whose loss went non-finite: it stopped there, short of any target."""
    where = (f" at step {run.diverged['step']} (first seen on rank {run.diverged['rank']})"
             if run.diverged else "")
    outcome = "not reached: diverged" if run.reached is not None else "diverged"
    return (f"{row.series.label()}, N={row.workers}, seed {run.seed}: {outcome}{where}; "
            f"best accuracy {run.best_accuracy:.3f}, {run.path}")


def recovery_line(row: AccuracyRow, run: AccuracyRun, rate: str) -> str:
    """A run under a --recovery policy: who took part, its goodput (in `rate`) over the
    wall time, failures included, and what each failure cost."""
    facts = run.recovery or {}
    policy = facts.get("policy", "restart")
    who, cost, since = RECOVERY_TERMS[policy]
    costs = "".join(f"; {c['event']}: {cost(c)}" for c in facts.get("costs", ()))
    return (f"{row.series.label()}, N={row.workers}, seed {run.seed}: --recovery {policy}, "
            f"{who(facts)}; goodput {facts['goodput']:.1f} {rate} over "
            f"{facts.get('wall_seconds', 0):.1f} s of wall time{since}{costs}; {run.path}")


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def _after(c: Dict[str, Any], none: str, some: str) -> str:
    return none if c["recovery_seconds"] is None else f"{c['recovery_seconds']:.1f} s {some}"


# Per policy: who took part, what a failure cost, and where the wall time starts. A
# restart redoes steps; torchft's and gossip's survivors go on with fewer workers.
RECOVERY_TERMS: Dict[str, Tuple[Callable[[Dict[str, Any]], str],
                                Callable[[Dict[str, Any]], str], str]] = {
    "restart": (lambda f: _count(f.get("restarts", 0), "restart"),
                lambda c: f"{c['recovery_seconds']:.1f} s to the first step after it, "
                          f"{c['steps_lost']} steps redone",
                " from the first start"),
    "torchft": (lambda f: f"{f.get('replica_groups')} replica groups",
                lambda c: _after(c, "no complete step after it",
                                 "to the first complete step after it")
                + f", {c['steps_with_fewer_groups']} steps with fewer groups",
                ""),
    "gossip": (lambda f: _count(len(f.get("survivors", ())), "survivor")
               + (f", {len(f['rejoined'])} rejoined" if f.get("rejoined") else ""),
               lambda c: f"detected after {c['detection_seconds']:.1f} s, "
                         + _after(c, "no exchange among the survivors after it",
                                  "to the first exchange among the survivors")
                         + f", {c['steps_with_fewer_workers']} steps with fewer workers"
                         + (f", rejoined after {c['rejoin_seconds']:.1f} s"
                            if c.get("rejoin_seconds") is not None else ""),
               ""),
}


def row_record(row: AccuracyRow) -> Dict[str, Any]:
    combined, wall = row.combined(), row.combined(wall=True)
    low_high = ttt.spread(row.times()) if row.has_target else None
    return {
        "strategy": row.series.strategy, "topology": row.series.settings(),
        "workers": row.workers, "runs": len(row.runs),
        "reached": row.reached if row.has_target else None,
        "target": row.runs[0].key.target or None,
        "time_to_target_s": combined.value if combined else None,
        "rule": combined.rule if combined else None,
        "rule_detail": combined.why if combined else None,
        "median_time_to_target_s": row.median_of("time"),
        "min_time_to_target_s": low_high[0] if low_high else None,
        "max_time_to_target_s": low_high[1] if low_high else None,
        "wall_time_to_target_s": wall.value if wall else None,
        "wall_rule": wall.rule if wall else None,
        "median_wall_time_to_target_s": row.median_of("wall_time"),
        "median_steps_to_target": row.median_of("steps"),
        "median_epochs_to_target": row.median_of("epochs"),
        "median_bytes_to_target": row.median_of("sent"),
        "best_accuracy_missed": row.best_missed, "img_sec": row.img_sec,
        "seeds": " ".join(str(r.seed) for r in row.runs),
        "flags": " ".join(row.flags),
    }


def group_record(g: AccuracyGroup) -> Dict[str, Any]:
    return {"key": g.key._asdict(), "title": g.key.title(),
            "rows": [dict(row_record(r), **({"failures": r.failures} if r.failures else {}),
                          step_split=r.split, wire=r.wire,
                          files=[str(run.path) for run in r.runs],
                          runs_detail=[run_record(run) for run in r.runs])
                     for r in g.rows]}


def run_record(run) -> Dict[str, Any]:
    return {"file": str(run.path), "seed": run.seed, "reached": run.reached,
            "time_to_target_s": run.time, "wall_time_to_target_s": run.wall_time,
            "steps_to_target": run.steps, "epochs_to_target": run.epochs,
            "bytes_to_target": run.sent,
            "best_accuracy": run.best_accuracy, "stopped_by": run.stopped_by,
            "img_sec": run.img_sec, "diverged": run.diverged,
            **({"recovery": run.recovery} if run.recovery is not None else {})}


def formatted_row(row: AccuracyRow) -> List[str]:
    settings = ", ".join(p for p in (row.series.settings(), row.failures) if p)
    head = [row.series.strategy, settings or "-", str(row.workers),
            str(len(row.runs))]
    by_loss = row.runs[0].best_loss is not None
    best = _num(row.best_loss_missed, "{:.4f}") if by_loss else _num(row.best_missed, "{:.3f}")
    tail = [best, _num(row.img_sec, "{:.1f}"),
            " ".join(row.flags) or "-"]
    if not row.has_target:
        return head + ["no target"] + ["-"] * 7 + tail
    combined = row.combined()
    low_high = ttt.spread(row.times())
    return head + [
        f"{row.reached}/{len(row.runs)}", _num(combined.value, "{:.2f}"), combined.label(),
        _num(row.median_of("time"), "{:.2f}"),
        "-" if low_high is None else f"{low_high[0]:.2f}-{low_high[1]:.2f}",
        _num(row.median_of("steps"), "{:g}"), _num(row.median_of("epochs"), "{:.2f}"),
        "-" if row.median_of("sent") is None else units.format_bytes(row.median_of("sent")),
    ] + tail


def _num(value: Optional[float], pattern: str) -> str:
    return "-" if value is None else pattern.format(value)
