"""Does the winner map's projection call the measured cells right? The winner-map study's
runs trained to accuracy on emulated links (benchmarks/studies/winner_map.json) against
the cells `commbench simulate` projects for the same links, calibrated on none of them:
compute from speed runs on shared memory (the in-job compute-only reference of 4 ranks,
which share this box's cores as the study's ranks do), the link as its stated rate, the
codec of PowerSGD from its measured split. A projected cell is each strategy's measured
steps to the target times the projected step (commbench.analysis.winner_map), so its
error is the step's.

    python benchmarks/models/winner_map_projection.py STUDY_RESULTS [--calibration DIR]
        [--out winner-map-projection] [--beyond 10gbit,100gbit]

Prints per cell and strategy the measured time to the target, the projected one and the
error; per strategy the median and worst |error| (target: median <= 10%, worst <= 20%);
and per cell whether the projection named the measured first (target: right in every
cell whose measured lead is clear). Then draws the map with the projected columns beside
the measured ones, and with the links this box cannot emulate (--beyond) projected, as
`commbench plot` does (OUT/charts).

Without --calibration it first runs the speed sweeps to calibrate on (shared memory, 4
ranks, a few minutes) into OUT/calibration.
"""

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

WORKLOAD = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32"]
PLAIN = "allreduce,neighbor_allreduce,local_sgd,diloco"
POWERSGD = ["--dist-optimizer", "allreduce", "--compression", "powersgd:4"]
# (flags of one `simulate` call): the strategies of the study, as it ran them
PROJECTED = [["--gpus-per-machine", "1", "--dist-optimizer", PLAIN],
             ["--gpus-per-machine", "1", *POWERSGD],
             ["--gpus-per-machine", "2", "--dist-optimizer", "hierarchical_neighbor_allreduce"]]


def commbench(*args) -> None:
    command = [sys.executable, "-m", "commbench", *map(str, args)]
    print("$ commbench", " ".join(map(str, args)), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def calibrate(directory: Path) -> None:
    for flags in (["--dist-optimizer", PLAIN], POWERSGD):
        commbench("sweep", "--np", "4", "--oversubscribe", *flags, *WORKLOAD,
                  "--results-dir", directory,
                  "--plots-dir", directory / "charts")


def study_settings(results: Path):
    """(the study's accuracy groups, its emulated links, its straggler settings)."""
    from commbench.analysis.accuracy import group
    from commbench.analysis.accuracy_reading import usable
    from commbench.result.store import load_results

    runs, notes = usable(load_results([results])[0])
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    groups = group(runs)
    from commbench.analysis.winner_cells import network_order

    # uneven links ("1gbit (m3 at 100mbit)") have no single rate to state
    links = sorted({g.key.network for g in groups if g.key.network and " " not in g.key.network},
                   key=network_order)
    return groups, links, sorted({g.key.stragglers for g in groups})


def project(calibration: Path, out: Path, links, stragglers) -> None:
    for link in links:
        for slow in stragglers:
            for i, flags in enumerate(PROJECTED):
                commbench("simulate", calibration, "--np", "4", "--link", link,
                          "--compute-from", "each", "--slow-ranks", slow or "none", *flags,
                          "-o", out / f"{link}-{(slow or 'none').replace(':', 'x')}-{i}")


def compare(groups, projections) -> None:
    from commbench.analysis import winner_cells, winner_map

    errors = {}
    calls = []
    print(f"\n{'stragglers':<16} {'link':<8} {'strategy':<58} {'measured':>9} "
          f"{'projected':>9} {'error':>7}")
    for found in winner_map.maps(groups, projections):
        for (slow, network), cell in sorted(found.cells.items()):
            projected = found.cells.get((slow, network + winner_cells.PROJECTED_COLUMN))
            if cell.kind.projected or projected is None:
                continue
            # a strategy is the same whatever layout its label names
            by_strategy = {e.strategy: e.value for e in projected.ranked}
            for entry in cell.ranked:
                if entry.strategy not in by_strategy:
                    continue
                error = by_strategy[entry.strategy] / entry.value - 1
                errors.setdefault(entry.label, []).append(error)
                print(f"{winner_cells.row_name(slow):<16} {network:<8} {entry.label[:58]:<58} "
                      f"{entry.value:8.1f}s {by_strategy[entry.strategy]:8.1f}s "
                      f"{100 * error:+6.1f}%")
            if cell.ranked and projected.ranked:
                calls.append((slow, network, cell.verdict, cell.ranked[0].strategy,
                              projected.ranked[0].strategy, projected.verdict))
    print("\nper strategy: |error| median, worst (target: <= 10%, <= 20%)")
    for label, found in sorted(errors.items()):
        size = [abs(e) for e in found]
        met = statistics.median(size) <= 0.10 and max(size) <= 0.20
        print(f"  {label[:70]:<70} {100 * statistics.median(size):5.1f}% "
              f"{100 * max(size):5.1f}%  {'met' if met else 'NOT met'} ({len(size)} cells)")
    print("\nthe first, measured and projected (target: right where the measured lead is "
          "clear)")
    for slow, network, verdict, measured, projected, called in calls:
        right = "not called" if called == winner_cells.TOO_CLOSE else \
            "right" if measured == projected else "WRONG"
        print(f"  {winner_cells.row_name(slow):<16} {network:<8} measured: {measured[:40]} "
              f"({verdict}); projected: {projected[:40]} ({called}): {right}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the study's results (one partition)")
    parser.add_argument("--calibration", type=Path,
                        help="speed runs on shared memory to calibrate on (default: run them)")
    parser.add_argument("--out", type=Path, default=Path("winner-map-projection"))
    parser.add_argument("--beyond", default="10gbit,100gbit",
                        help="links this box cannot emulate, projected as further columns")
    args = parser.parse_args()
    from commbench.analysis import plot_command
    from commbench.result.store import load_results
    from commbench.simulate import projection_file

    calibration = args.calibration or args.out / "calibration"
    if args.calibration is None:
        calibrate(calibration)
    groups, links, stragglers = study_settings(args.results)
    if not links:
        sys.exit(f"{args.results}: no runs on emulated links to check a projection against")
    project(calibration, args.out / "held-out", links, stragglers)
    held_out, _ = projection_file.usable(load_results([args.out / "held-out"])[0])
    compare(groups, held_out)
    beyond = [link for link in args.beyond.split(",") if link]
    project(calibration, args.out / "beyond", beyond, stragglers)
    plot_command.plot([args.results, args.out / "beyond"], args.out / "charts")
    plot_command.plot([args.results, args.out / "held-out"], args.out / "charts-held-out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
