"""`commbench plot PATH...`: one scaling chart per group of comparable runs
(rendering in commbench.plots.scaling) and, where the runs recorded it, where their
steps' time went (commbench.plots.step_split); for runs trained to accuracy, their
curves and their time to target, and under failures their goodput
(commbench.plots.accuracy); a `--timeline` trace file
given as a PATH is drawn as a picture of its last steps (commbench.plots.timeline).
PNG, plus SVG or PDF on request.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import IO, Iterable, List, Optional, Sequence, Union

from commbench.analysis import reader
from commbench.analysis.accuracy import AccuracyGroup
from commbench.analysis.runs import Group

FORMATS = ("png", "svg", "pdf")


def add_arguments(parser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="result files or directories (searched recursively)")
    parser.add_argument("-o", "--output-dir", default="charts", metavar="DIR",
                        help="where to write the charts (default: charts)")
    parser.add_argument("--format", action="append", choices=FORMATS, default=[],
                        help="also write this format beside the PNG, which is always "
                        "written (repeatable)")


def main(args) -> int:
    return plot(args.paths, args.output_dir, args.format)


def plot(paths: Iterable[Union[str, Path]], out_dir: Union[str, Path] = "charts",
         formats: Sequence[str] = (), out: Optional[IO[str]] = None,
         err: Optional[IO[str]] = None) -> int:
    """Draw every group under paths into out_dir and print the files written;
    1 when no usable result was found."""
    out = out or sys.stdout
    paths = [Path(p) for p in paths]
    traces = [p for p in paths if timeline_trace(p) is not None]
    written = write_timelines(traces, out_dir, formats)
    paths = [p for p in paths if p not in traces]
    if not paths:
        for path in written:
            print(path, file=out)
        return 0
    found = reader.load_for("plot", paths, err or sys.stderr)
    if found is None:
        return 1
    groups, trained, benches, projections = found
    written += write_charts(groups, out_dir, formats) if groups else []
    written += write_accuracy_charts(trained, out_dir, formats, projections) if trained else []
    if benches:
        from commbench.plots import microbench as microbench_charts

        written += microbench_charts.write(benches, out_dir, formats)
    if projections:  # their own charts, dashed and titled PROJECTION
        from commbench.plots import projection as simulate

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        written += simulate.chart_files(projections, out_dir, formats)
        written += write_winner_maps(projections, out_dir, formats, projected=True)
    for path in written:
        print(path, file=out)
    out.flush()
    return 0


def write_charts(groups: List[Group], out_dir: Union[str, Path],
                 formats: Sequence[str] = ()) -> List[Path]:
    from commbench.plots import scaling, step_split

    styles = scaling.palette(s for g in groups for s in g.series)
    written = []
    for group, name in zip(groups, chart_names(groups)):
        written += scaling.save_named(scaling.figure(group, styles), out_dir, name, formats)
        if group.has_split:
            written += scaling.save_named(step_split.figure(group), out_dir,
                                          name.replace("scaling-", "split-", 1), formats)
    return written + write_winner_maps(groups, out_dir, formats)


def write_accuracy_charts(groups: List[AccuracyGroup], out_dir: Union[str, Path],
                          formats: Sequence[str] = (), projections: List = ()) -> List[Path]:
    """accuracy-<group>: the curves; time-to-target-<group>: the time to the target per
    strategy (groups trained without a target have no such chart); goodput-<group>, where
    runs ran under --fail or a recovery policy: their goodput beside their throughput;
    failure-rate-<group>, where a contender ran under several random failure rates;
    the winner maps with the projections of their workload beside them."""
    from commbench.plots import accuracy, failure_rate, scaling

    styles = accuracy.palette(groups)
    written = []
    for group, name in zip(groups, unique_names([g.key.slug() for g in groups],
                                                [g.key.hardware for g in groups])):
        written += scaling.save_named(accuracy.curves_figure(group, styles), out_dir,
                                      f"accuracy-{name}", formats)
        if accuracy.has_times(group):
            written += scaling.save_named(accuracy.time_figure(group, styles), out_dir,
                                          f"time-to-target-{name}", formats)
        if accuracy.has_failures(group):
            written += scaling.save_named(accuracy.goodput_figure(group, styles), out_dir,
                                          f"goodput-{name}", formats)
        if failure_rate.has_rates(group):
            written += scaling.save_named(failure_rate.figure(group), out_dir,
                                          f"failure-rate-{name}", formats)
    return written + write_winner_maps(groups, out_dir, formats, projections=projections)


def write_winner_maps(groups: List, out_dir: Union[str, Path],
                      formats: Sequence[str] = (), projected: bool = False,
                      projections: List = ()) -> List[Path]:
    """winner-map-<group>-n<N>: where the groups' runs (trained to accuracy, or speed
    runs) span several networks or straggler settings, the best in each
    (commbench.analysis.winner_map), with projected columns from `projections`; with
    projected, the groups are projection files and the maps winner-map-projected-n<N>."""
    from commbench.analysis import winner_map, winner_projection
    from commbench.plots import scaling
    from commbench.plots import winner_map as chart

    found = winner_projection.projected_maps(groups) if projected else \
        winner_map.maps(groups, projections)
    names = unique_names([f"{m.slug}-n{m.workers}" for m in found],
                         [m.hardware for m in found])
    written = []
    for each, name in zip(found, names):
        written += scaling.save_named(chart.figure(each), out_dir, f"winner-map-{name}",
                                      formats)
    return written


def timeline_trace(path: Path) -> Optional[dict]:
    """The trace of a `--timeline` file, or None for anything else (results are read
    elsewhere, and what is neither is reported there)."""
    if not path.is_file() or path.suffix != ".json":
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(doc, dict) and "commbench" in (doc.get("otherData") or {}) \
            and isinstance(doc.get("traceEvents"), list):
        return doc
    return None


def write_timelines(traces: List[Path], out_dir: Union[str, Path],
                    formats: Sequence[str] = ()) -> List[Path]:
    """timeline-<trace's name>.png for each trace file."""
    if not traces:
        return []
    from commbench.plots import scaling, timeline

    return [path for trace in traces for path in scaling.save_named(
        timeline.figure(timeline_trace(trace)), out_dir, f"timeline-{trace.stem}", formats)]


def chart_names(groups: List[Group]) -> List[str]:
    """scaling-<model>-bs<batch>-<px>-<precision>-<device>-<backend>[-<tag>], plus the
    hardware where two groups differ only in it."""
    return ["scaling-" + name for name in unique_names([g.key.slug() for g in groups],
                                                      [g.key.hardware for g in groups])]


def unique_names(slugs: List[str], hardware: List[str]) -> List[str]:
    """File-safe names (nothing a result says can leave the output directory), with the
    hardware added where two groups differ only in it, and a count where they are
    alike in that too (one chart never overwrites another)."""
    names = []
    for slug, machine in zip(slugs, hardware):
        if slugs.count(slug) > 1 and machine:
            slug += "-" + machine
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", slug).strip("_")
        taken, count = set(names), 2
        unique = name
        while unique in taken:
            unique, count = f"{name}-{count}", count + 1
        names.append(unique)
    return names
