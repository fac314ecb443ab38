"""`commbench plot PATH...`: one scaling chart per group of comparable runs
(rendering in commbench.plots.scaling), written as PNG, plus SVG or PDF on request.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import IO, Iterable, List, Optional, Sequence, Union

from commbench.analysis import runs
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
    found = runs.load_for("plot", paths, err or sys.stderr)
    if found is None:
        return 1
    groups, benches, projections = found
    written = write_charts(groups, out_dir, formats) if groups else []
    if benches:
        from commbench.plots import microbench as microbench_charts

        written += microbench_charts.write(benches, out_dir, formats)
    if projections:  # their own charts, dashed and titled PROJECTION
        from commbench.plots import projection as simulate

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        written += simulate.chart_files(projections, out_dir, formats)
    for path in written:
        print(path, file=out)
    out.flush()
    return 0


def write_charts(groups: List[Group], out_dir: Union[str, Path],
                 formats: Sequence[str] = ()) -> List[Path]:
    from commbench.plots import scaling

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    styles = scaling.palette(s for g in groups for s in g.series)
    written = []
    for group, name in zip(groups, chart_names(groups)):
        paths = [out_dir / f"{name}.{ext}" for ext in dict.fromkeys(["png", *formats])]
        scaling.save(scaling.figure(group, styles), paths)
        written += paths
    return written


def chart_names(groups: List[Group]) -> List[str]:
    """scaling-<model>-bs<batch>-<px>-<precision>-<device>-<backend>[-<tag>], plus the
    hardware where two groups differ only in it."""
    slugs = [g.key.slug() for g in groups]
    names = []
    for group, slug in zip(groups, slugs):
        if slugs.count(slug) > 1:
            slug += "-" + group.key.hardware
        names.append("scaling-" + re.sub(r"[^A-Za-z0-9._-]+", "_", slug).strip("_"))
    return names
