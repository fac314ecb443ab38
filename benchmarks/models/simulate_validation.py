"""Is `commbench simulate` right? Its projections against runs it never saw, on
emulated clusters and on shared memory. Needs root (network namespaces).

    python benchmarks/models/simulate_validation.py collect [--out simulate-validation]  # 40 min
    python benchmarks/models/simulate_validation.py collect --runs-only --repeats 1 ...  # more
    python benchmarks/models/simulate_validation.py analyse [--out simulate-validation]  # seconds
    python benchmarks/models/simulate_validation.py collect --workload lm-tiny --out ...  # LM

collect: microbench files to calibrate the links on -- the smallest multi-machine
layout (2 machines x 1 rank) at the calibration rate, and 2 and 4 ranks on shared
memory -- then runs (resnet18, or --workload lm-tiny: validation_workloads.py; gloo) of
allreduce, neighbor_allreduce and hierarchical_neighbor_allreduce, twice each, on 1x2,
1x4 (shared memory), 2x1, 2x2, 4x1, 4x2 emulated machines at the calibration and a held-out rate.

analyse: per strategy and layout, the projection from the calibration alone: links
fitted on the microbench files (at the held-out rate, the fitted cost per byte scaled by
the ratio of rates, latency kept); the overlap efficiency fitted per strategy on the
smallest layout of each network class (2x1 at the calibration rate; 1x2 on shared
memory), whose points are therefore not scored; compute taken from each run's own
in-job reference (two host cores are shared by every rank, so CPU sharing is measured,
not modelled). Printed: the error against the measured mean beside the measurement's
95% interval over repeats, the same for the model with its straggler term and with
full overlap, and the errors of two naive baselines: linear scaling of the reference,
and compute + bytes on the busiest link / nominal rate with no overlap.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from commbench.comm.machine_averaging import PIPELINE_BYTES
from validation_report import draw, print_errors, print_fits, print_table
from validation_workloads import RESNET, WORKLOADS

TIMING = ["--num-warmup-batches", "3", "--num-batches-per-iter", "3", "--num-iters", "6",
         "--reference-iters", "2", "--reference-seconds", "0.5", "--cpu-transport", "gloo"]
MICROBENCH = ["microbench", "-b", "256K", "-e", "16M", "-f", "4", "-n", "10", "-w", "3",
              "--no-raw", "--cpu-transport", "gloo"]
CALIBRATION_RATE, HELD_OUT_RATE = "1gbit", "300mbit"
CLUSTER_LAYOUTS = [(2, 1), (2, 2), (4, 1), (4, 2)]
SHARED_MEMORY = [2, 4]
STRATEGIES = ["allreduce", "neighbor_allreduce", "hierarchical_neighbor_allreduce"]
REPEATS = 2


def collect(out: Path, work=RESNET, repeats: int = REPEATS, runs_only: bool = False) -> None:
    """The calibration files (unless runs_only) and `repeats` rounds of runs; run again
    with --runs-only to add repeats to a collection."""
    from commbench.cluster import namespaces
    from commbench.sweep.execute import job_environment, run_one
    from commbench.sweep.plan import plan_emulated

    env = job_environment()
    env.pop("OMP_NUM_THREADS", None)
    begin = time.monotonic()
    python = [sys.executable, "-m", "commbench"]
    mpiexec = ["mpiexec", "--oversubscribe", "--bind-to", "none"]
    for n in [] if runs_only else SHARED_MEMORY:
        run(mpiexec + ["-n", str(n)] + python + MICROBENCH +
            ["--results-dir", str(out / "calibration" / "shared-memory")], env)
    for _ in range(repeats):
        for n in SHARED_MEMORY:
            for strategy in STRATEGIES[:2]:
                run(mpiexec + ["-n", str(n)] + python + [f"--dist-optimizer={strategy}",
                    *work.flags, *TIMING,
                    "--results-dir", str(out / "runs" / "shared-memory" / f"1x{n}")], env)
    name = f"v{os.getpid() % 10**6}"
    for rate in (CALIBRATION_RATE, HELD_OUT_RATE):
        cluster = namespaces.up(name, 4, 2, rate)
        try:
            path = {**env, "PATH": f"{cluster.bin}{os.pathsep}{env['PATH']}"}
            hosts = f"{cluster.machine(0)}:1,{cluster.machine(1)}:1"
            if not runs_only:
                run(["mpirun", "-H", hosts, "-np", "2", "--bind-to", "none"] + python +
                    MICROBENCH + ["--results-dir", str(out / "calibration" / rate)], path)
            for repeat in range(repeats):
                for m, s in CLUSTER_LAYOUTS:
                    strategies = STRATEGIES if s > 1 else STRATEGIES[:2]
                    directory = str(out / "runs" / rate / f"{m}x{s}")
                    for job in plan_emulated([(m, s)], [rate], name, strategies,
                                             work.flags + TIMING, directory):
                        output = run_one(job, 1800, path)
                        print(f"{rate} {m}x{s} {job.strategy} #{repeat + 1}: "
                              f"{job.headline if job.ok else 'FAILED ' + output[-1500:]}",
                              flush=True)
        finally:
            namespaces.down(name)
    print(f"collected in {(time.monotonic() - begin) / 60:.1f} min")


def run(command, env) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    said = (done.stdout.strip().splitlines() or [""])[-1] if done.returncode == 0 else \
        done.stderr[-1500:]
    print(f"{'ok' if done.returncode == 0 else 'FAILED'} {' '.join(command[-8:])}: {said}",
          flush=True)


def analyse(out: Path, work=RESNET) -> None:
    """Every strategy and layout of OUT/runs projected from the calibration alone:
    OUT/validation.json, the printed table and errors, and OUT/validation.png."""
    from commbench.simulate import language

    begin = time.monotonic()
    calibrated = fit_links(out)
    overlaps = fit_overlaps(out, calibrated, work)
    table = [row for rate_dir in sorted((out / "runs").iterdir())
             for row in rows_at(rate_dir, calibrated, work, overlaps)]
    (out / "validation.json").write_text(json.dumps(table, indent=1))
    print_table(table)
    print()
    print_errors(table)
    print_fits(overlaps, calibrated)
    print(f"analysed in {time.monotonic() - begin:.1f} s")
    draw(table, out / "validation.png", CALIBRATION_RATE, HELD_OUT_RATE,
         language.described(work.model, work.batch, work.size), language.rate(work.model))


def fit_links(out: Path):
    """The links fitted on the microbench files: on shared memory, and between machines
    at the calibration rate."""
    from commbench.result.store import load_results
    from commbench.simulate import calibrate, link_costs

    benches, _ = load_results([out / "calibration" / "shared-memory",
                               out / "calibration" / CALIBRATION_RATE])
    fitted = calibrate.fit_microbench([b.doc for b in benches], [b.path.name for b in benches])
    return link_costs.Network(fitted[("intra", "allreduce")], fitted[("inter", "allreduce")],
                              fitted[("intra", "neighbor_allreduce")],
                              fitted[("inter", "neighbor_allreduce")])


def fit_overlaps(out: Path, calibrated, work) -> dict:
    """{network class: [overlap efficiency per strategy, the same for the model with its
    straggler term]}, each fitted at the class's calibration layout."""
    # Between machines 2x1 at the calibration rate; on shared memory, 1x2 (a transfer
    # there is a copy by the same loaded cores, so it hides differently).
    return {kind: [fit_overlap_at(out / "runs" / directory, calibrated, work, slowed)
                   for slowed in (False, True)]
            for kind, directory in (("network", f"{CALIBRATION_RATE}/2x1"),
                                    ("shared-memory", "shared-memory/1x2"))}


def fit_overlap_at(directory, net, work, stragglers: bool):
    """Per strategy, the overlap efficiency that meets its runs in `directory` (a
    calibration layout), for the model with or without its straggler term."""
    from commbench.result.store import load_results
    from commbench.simulate.project import Inputs, fit_overlap
    from commbench.simulate.strategy import Strategy

    found, _ = load_results([directory])
    fits = {}
    for name in sorted({r.doc["config"]["dist_optimizer"] for r in found}):
        mine = [r for r in found if r.doc["config"]["dist_optimizer"] == name]
        c = work.reference_compute(mine)
        measured = statistics.mean(r.doc["summary"]["total_img_sec"]["mean"] for r in mine)
        per_machine = int(mine[0].doc["environment"]["local_size"])
        inputs = Inputs(work.per_step, work.gradients(), net, per_machine, {2: c}, ("ring",),
                        measured={(Strategy(name).label(), 2): (measured, None)},
                        pipeline_bytes=PIPELINE_BYTES["gloo"])
        fits.update(fit_overlap([Strategy(name)], 2, inputs, stragglers))
    return fits


def network_at(calibrated, rate: str):
    """The calibrated links at `rate`: at a held-out rate the fitted cost per byte between
    machines scaled by the ratio of rates, latency kept."""
    from commbench import units

    if rate in (CALIBRATION_RATE, "shared-memory"):
        return calibrated
    factor = units.rate_bits(CALIBRATION_RATE) / units.rate_bits(rate)
    return replace(calibrated,
                   inter=replace(calibrated.inter, beta=calibrated.inter.beta * factor),
                   exchange_inter=replace(calibrated.exchange_inter,
                                          beta=calibrated.exchange_inter.beta * factor))


def rows_at(rate_dir: Path, calibrated, work, overlaps) -> list:
    """The table's rows for one network (`rate_dir`: a folder of layouts), one per layout
    and strategy."""
    from commbench.result.store import load_results

    rate = rate_dir.name
    overlap = overlaps["shared-memory" if rate == "shared-memory" else "network"]
    net = network_at(calibrated, rate)
    rows = []
    for layout_dir in sorted(rate_dir.iterdir()):
        m, s = map(int, layout_dir.name.split("x"))
        found, _ = load_results([layout_dir])
        runs = [r for r in found if r.kind == "run"]
        for strategy_name in sorted({r.doc["config"]["dist_optimizer"] for r in runs}):
            mine = [r for r in runs if r.doc["config"]["dist_optimizer"] == strategy_name]
            rows.append(row_for(rate, (m, s), strategy_name, mine, net, work, overlap))
    return rows


def row_for(rate: str, layout, strategy_name: str, mine, net, work, overlap) -> dict:
    """One row of the table: the strategy's runs `mine` on `layout` (machines, ranks per
    machine) against the model's projections and the two naive baselines."""
    from commbench import units
    from commbench.result import metrics
    from commbench.simulate import costs
    from commbench.simulate.strategy import Strategy

    m, s = layout
    n = m * s
    c = work.reference_compute(mine)
    strategy = Strategy(strategy_name)
    row, full, slowed = projections(strategy, n, s, c, net, work, overlap)
    totals = [r.doc["summary"]["total_img_sec"]["mean"] for r in mine]
    measured = statistics.mean(totals)
    linear = n * work.per_step / c.seconds
    naive = n * work.per_step / (c.seconds + _bytes_on_busiest_link(
        strategy, costs.Layout(n, s), work.gradients().total) / (units.rate_bits(rate) / 8
                                                      if m > 1 else 1 / net.intra.beta))
    return {
        "network": rate, "layout": f"{m}x{s}", "strategy": strategy_name,
        "measured": measured, "ci95": metrics.ci95_halfwidth(totals), "runs": len(totals),
        "projected": row.img_sec, "band": [row.low, row.high],
        "with_stragglers": slowed.with_stragglers,
        "error": row.img_sec / measured - 1,
        "full_overlap_error": full.img_sec / measured - 1,
        "error_with_stragglers": (slowed.with_stragglers / measured - 1
                                  if slowed.with_stragglers else None),
        "linear_error": linear / measured - 1, "naive_error": naive / measured - 1,
        "held_out": rate not in (CALIBRATION_RATE, "shared-memory"),
        "calibration_point": (rate, m, s) in ((CALIBRATION_RATE, 2, 1),
                                              ("shared-memory", 1, 2))}


def projections(strategy, n: int, per_machine: int, c, net, work, overlap):
    """The model's projections for `strategy` on n workers given the step's compute `c`:
    with the fitted overlap (a strategy not fitted: the mean), with full overlap, and
    with the overlap fitted for its straggler term."""
    from commbench.simulate.project import Inputs, project

    fitted, fitted_slowed = overlap
    mean, mean_slowed = (statistics.mean(o.values()) for o in (fitted, fitted_slowed))
    inputs = Inputs(work.per_step, work.gradients(), net, per_machine, {n: c}, ("ring",),
                    overlap=mean, overlaps=fitted, pipeline_bytes=PIPELINE_BYTES["gloo"])
    (row,) = project([strategy], [n], inputs)
    (full,) = project([strategy], [n], replace(inputs, overlap=1.0, overlaps={}))
    (slowed,) = project([strategy], [n], replace(inputs, overlap=mean_slowed,
                                                 overlaps=fitted_slowed))
    return row, full, slowed


def _bytes_on_busiest_link(strategy, layout, nbytes) -> float:
    """The naive baseline's bytes: what the strategy puts on its busiest link per step."""
    from commbench.simulate import costs

    p, g, m = layout.workers, layout.local, layout.machines
    if strategy.name == "allreduce":
        return 2 * (p - 1) / p * nbytes
    if strategy.name == "neighbor_allreduce":
        load = costs.exchange(strategy.topology, p, strategy.dynamic, g if m > 1 else p)
        return max(load.nic, load.intra) * nbytes
    load = costs.exchange(strategy.topology, m, strategy.dynamic, 1)
    return (load.nic if m > 1 else 0) * nbytes + 2 * (g - 1) / g * nbytes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("collect", "analyse"))
    parser.add_argument("--out", default="simulate-validation", type=Path)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default=RESNET.model,
                        help="what the runs train (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="rounds of runs to collect")
    parser.add_argument("--runs-only", action="store_true",
                        help="collect runs only: add repeats to an earlier collection")
    args = parser.parse_args()
    if args.step == "collect":
        collect(args.out, WORKLOADS[args.workload], args.repeats, args.runs_only)
    else:
        analyse(args.out, WORKLOADS[args.workload])


if __name__ == "__main__":
    main()
