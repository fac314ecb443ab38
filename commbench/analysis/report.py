"""`commbench report PATH...`: one table per group of comparable runs, with
throughput and its confidence interval, both scaling efficiencies, latency,
communication overhead and consensus distance; for runs trained to accuracy, one table
per group with the time to the target (commbench.analysis.accuracy_tables).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Any, Dict, Iterable, List, Optional, Union

from commbench.result import metrics
from commbench.analysis import (accuracy_tables, grouping, reader, runs, split_table, tables,
                                winner_table)
from commbench.analysis.runs import Group, Point
from commbench.microbench import results as microbench
from commbench.result.store import to_json

FORMATS = ("text", "markdown", "csv", "json")

NOTES = [
    "N: workers. runs: result files combined into the row (repeats of one configuration).",
    "+- 95%: confidence interval of the mean total img/sec: over the iterations of one "
    "run, over the runs' means when a configuration was repeated.",
    "E(N) = Total(N) / (N x Total(1)), across jobs; Total(1) is the same strategy's "
    "1-worker runs (what it does minus the communication), or the compute-only `none`'s "
    "for a strategy without one.",
    "E* = Total / the workers' compute-only rate measured in the same job, by all workers "
    "at once, before and after the run (in-job; the `none` strategy measures no "
    "reference).",
    "p50/p90: seconds per batch, pooled over ranks. comm: communication overhead, "
    "1 - compute-only time / step time.",
    "consensus: final consensus distance, mean over workers of |x_r - mean x|^2 / "
    "|mean x|^2 (decentralized strategies).",
]

HEADERS = ["strategy", "topology", "N", "runs", "total img/sec", "+- 95%", "per worker",
           "E(N)", "E* in-job", "p50 s", "p90 s", "comm", "consensus", "not to be trusted"]
ALIGN = "llrrrrrrrrrrrl"
MARK = "!"  # after a number that a flag of its row puts in doubt
GROUP_COLUMNS = list(runs.GroupKey._fields)


def add_arguments(parser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="result files or directories (searched recursively)")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="output format (default: text)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write the report to FILE instead of standard output")


def main(args) -> int:
    if args.output is None:
        return report(args.paths, args.format)
    with open(args.output, "w", encoding="utf-8") as out:
        return report(args.paths, args.format, out=out)


def report(paths: Iterable[Union[str, Path]], fmt: str = "text",
           out: Optional[IO[str]] = None, err: Optional[IO[str]] = None) -> int:
    """Write the report of the results under paths; 1 when none is usable."""
    out = out or sys.stdout
    found = reader.load_for("report", paths, err or sys.stderr)
    if found is None:
        return 1
    groups, trained, benches, projections = found
    parts = [(render, groups), (winner_table.render, groups), (accuracy_tables.render, trained),
             (lambda found, f: winner_table.render(found, f, projections), trained),
             (microbench.render, benches)]
    texts = [text for text in (draw(items, fmt) for draw, items in parts if items) if text]
    if fmt == "json" and (projections or len(texts) > 1):  # one JSON document
        doc: Dict[str, Any] = {}
        for text in texts:
            doc.update(json.loads(text))
        doc.update({"projections": [p.doc for p in projections]} if projections else {})
        out.write(to_json(doc, indent=1) + "\n")
    else:
        if projections:
            from commbench.simulate import table as simulate

            texts.append(simulate.render_files(projections, fmt))
            projected = winner_table.render_projected(projections, fmt)
            texts += [projected] if projected else []
        out.write("\n".join(texts))
    out.flush()
    return 0


def render(groups: List[Group], fmt: str = "text") -> str:
    if fmt == "json":
        return to_json({"groups": [group_record(g) for g in groups]}, indent=1) + "\n"
    if fmt == "csv":
        columns = GROUP_COLUMNS + list(ROW_FIELDS)
        rows = [[g.key._asdict()[c] for c in GROUP_COLUMNS] + [r[c] for c in ROW_FIELDS]
                for g in groups for r in map(point_record, g.points)]
        return tables.csv_text(columns, rows)
    parts = []
    for g in groups:
        table = tables.render(headers(g), [formatted_row(p) for p in g.points], ALIGN, fmt)
        parts.append(f"{tables.heading(g.key.title(), fmt)}\n\n{baseline_line(g)}\n\n{table}")
        if any(p.diverged for p in g.points):
            parts.append(tables.lines(diverged_lines(g), fmt))
        unrecorded = split_table.unrecorded_lines(
            (p.series, p.workers, run) for p in g.points for run in p.runs)
        if unrecorded:
            parts.append(tables.lines(unrecorded, fmt))
        if g.has_split:
            parts.append(split_table.render(
                [(p.series, p.workers, p.split, p.sent, "") for p in g.points], fmt))
    flags = dict.fromkeys(f for g in groups for p in g.points for f in p.flags)
    flagged = [f"{MARK}: a number its row's flags put in doubt. Flags: "
               + "; ".join(f"{flag}: {metrics.FLAGS[flag]}" for flag in flags)] if flags else []
    return "\n".join(parts) + "\n" + tables.notes(NOTES + flagged, fmt)


def headers(group: Group) -> List[str]:
    """The table's columns, its throughput in the unit its runs counted."""
    return [h.replace("img/sec", grouping.rate(group)) for h in HEADERS]


def diverged_lines(group: Group) -> List[str]:
    """One line per run of the group whose loss went non-finite, saying where."""
    return [f"Diverged at step {run.diverged['step']} (first seen on rank "
            f"{run.diverged['rank']}): {p.series.label()}, N={p.workers}, {run.path}; its "
            f"{grouping.rate(group)} stand" for p in group.points for run in p.diverged]


def baseline_line(group: Group) -> str:
    if not group.baselines:
        return "No 1-worker run in this group: no Total(1), so no E(N); E* is measured in-job."
    own = sorted({b.source: b for b in group.baselines.values()}.values(),
                 key=lambda b: b.source.order())
    listed = ", ".join(f"{b.source.label()} {b.total:.1f}" for b in own)
    borrowed = any(b.source != s for s, b in group.baselines.items())
    return (f"Total(1), each strategy's own 1-worker runs: {listed} {grouping.rate(group)}"
            + ("; the others against none's." if borrowed else "."))


# Raw numbers of one row, for --format csv and json.
ROW_FIELDS = tables.row_fields(
    "total_img_sec", "total_img_sec_ci95", "ci95_over", "img_sec_per_worker", "efficiency",
    "efficiency_ci95", "efficiency_in_job", "efficiency_in_job_ci95", "p50_seconds_per_batch",
    "p90_seconds_per_batch", "communication_overhead", "communication_overhead_ci95",
    "final_consensus_distance", "bytes_per_step", "messages_per_step", "bytes_per_image",
    "oversubscribed")


def point_record(p: Point) -> Dict[str, Any]:
    return {
        "strategy": p.series.strategy, "topology": p.series.settings(), "workers": p.workers,
        "runs": len(p.runs), "total_img_sec": p.total, "total_img_sec_ci95": p.ci,
        "ci95_over": p.ci_over, "img_sec_per_worker": p.per_worker,
        "efficiency": p.efficiency, "efficiency_ci95": p.efficiency_ci,
        "efficiency_in_job": p.efficiency_in_job,
        "efficiency_in_job_ci95": p.efficiency_in_job_ci,
        "p50_seconds_per_batch": p.latency.get("p50"),
        "p90_seconds_per_batch": p.latency.get("p90"),
        "communication_overhead": p.overhead, "communication_overhead_ci95": p.overhead_ci,
        "final_consensus_distance": p.final_consensus,
        **{key: (p.sent or {}).get(key)
           for key in ("bytes_per_step", "messages_per_step", "bytes_per_image")},
        "oversubscribed": p.oversubscribed,
        "flags": " ".join(p.flags),
    }


def group_record(g: Group) -> Dict[str, Any]:
    base = g.baseline
    return {"key": g.key._asdict(), "title": g.key.title(),
            "baseline_img_sec": base.total if base else None,
            "baseline_runs": base.runs if base else 0,
            "baselines": {s.label(): {"img_sec": b.total, "ci95": b.ci, "runs": b.runs,
                                      "from": b.source.label()}
                          for s, b in sorted(g.baselines.items(), key=lambda sb: sb[0].order())},
            "rows": [dict(point_record(p), files=[str(r.path) for r in p.runs],
                          step_split=p.split,
                          diverged=[dict(r.diverged, file=str(r.path)) for r in p.diverged])
                     for p in g.points]}


# Which flags put which column in doubt.
DOUBTS = {"total": ("noisy", "oversubscribed"), "E(N)": ("E(N)>100%", "noisy", "oversubscribed"),
          "E*": ("E*>100%", "reference", "oversubscribed"),
          "comm": ("comm<0", "reference", "oversubscribed")}


def formatted_row(p: Point) -> List[str]:
    flags = p.flags

    def mark(text: str, column: str) -> str:
        doubtful = text != "-" and any(f in flags for f in DOUBTS[column])
        return text + MARK if doubtful else text

    return [p.series.strategy, p.series.settings() or "-", str(p.workers), str(len(p.runs)),
            mark(f"{p.total:.1f}", "total"), _num(p.ci, "{:.1f}"), f"{p.per_worker:.1f}",
            mark(_pct(p.efficiency), "E(N)"), mark(_pct(p.efficiency_in_job), "E*"),
            _num(p.latency.get("p50"), "{:.4f}"), _num(p.latency.get("p90"), "{:.4f}"),
            mark(_pct(p.overhead), "comm"), _num(p.final_consensus, "{:.3g}"),
            " ".join(flags) or "-"]


def _num(value: Optional[float], pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
