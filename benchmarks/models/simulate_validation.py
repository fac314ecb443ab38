"""Is `commbench simulate` right? Its projections against runs it never saw, on
emulated clusters and on shared memory. Needs root (network namespaces).

    python benchmarks/models/simulate_validation.py collect [--out simulate-validation]  # 40 min
    python benchmarks/models/simulate_validation.py collect --runs-only --repeats 1 ...  # more
    python benchmarks/models/simulate_validation.py analyse [--out simulate-validation]  # seconds

collect: microbench files to calibrate the links on -- the smallest multi-machine
layout (2 machines x 1 rank) at the calibration rate, and 2 and 4 ranks on shared
memory -- then resnet18 runs (32 px, batch 32, gloo) of allreduce, neighbor_allreduce
and hierarchical_neighbor_allreduce, twice each, on 1x2 and 1x4 (shared memory) and on
2x1, 2x2, 4x1 and 4x2 emulated machines at the calibration rate and at a held-out rate.

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
from pathlib import Path

from commbench.comm.machine_averaging import PIPELINE_BYTES

MODEL = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32",
         "--num-warmup-batches", "3", "--num-batches-per-iter", "3", "--num-iters", "6",
         "--reference-iters", "2", "--reference-seconds", "0.5", "--cpu-transport", "gloo"]
MICROBENCH = ["microbench", "-b", "256K", "-e", "16M", "-f", "4", "-n", "10", "-w", "3",
              "--no-raw", "--cpu-transport", "gloo"]
CALIBRATION_RATE, HELD_OUT_RATE = "1gbit", "300mbit"
CLUSTER_LAYOUTS = [(2, 1), (2, 2), (4, 1), (4, 2)]
SHARED_MEMORY = [2, 4]
STRATEGIES = ["allreduce", "neighbor_allreduce", "hierarchical_neighbor_allreduce"]
REPEATS = 2


def collect(out: Path, repeats: int = REPEATS, runs_only: bool = False) -> None:
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
                run(mpiexec + ["-n", str(n)] + python + [f"--dist-optimizer={strategy}", *MODEL,
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
                    for job in plan_emulated([(m, s)], [rate], name, strategies, MODEL,
                                             directory):
                        output = run_one(job, 1800, path)
                        print(f"{rate} {m}x{s} {job.strategy} #{repeat + 1}: "
                              f"{job.headline if job.ok else 'FAILED ' + output[-1500:]}",
                              flush=True)
        finally:
            namespaces.down(name)
    print(f"collected in {(time.monotonic() - begin) / 60:.1f} min")


def run(command, env) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    print(("ok " if done.returncode == 0 else "FAILED ") + " ".join(command[-8:]) + ": " +
          (last if done.returncode == 0 else done.stderr[-1500:]), flush=True)


def analyse(out: Path) -> None:
    from dataclasses import replace

    from commbench import units
    from commbench.results import load_results
    from commbench.simulate import calibrate, compute, costs, link_costs
    from commbench.simulate.project import Inputs, project
    from commbench.simulate.step import Strategy

    begin = time.monotonic()
    benches, _ = load_results([out / "calibration" / "shared-memory",
                               out / "calibration" / CALIBRATION_RATE])
    fitted = calibrate.fit_microbench([b.doc for b in benches], [b.path.name for b in benches])
    calibrated = link_costs.Network(fitted[("intra", "allreduce")], fitted[("inter", "allreduce")],
                                 fitted[("intra", "neighbor_allreduce")],
                                 fitted[("inter", "neighbor_allreduce")])
    grads = compute.gradients("resnet18", 32)
    # The overlap efficiency of each network class, fitted at its calibration layout:
    # between machines 2x1 at the calibration rate; on shared memory, 1x2 (a transfer
    # there is a copy by the same loaded cores, so it hides differently).
    overlaps = {kind: [fit_overlap_at(out / "runs" / directory, calibrated, grads, slowed)
                       for slowed in (False, True)]
                for kind, directory in (("network", f"{CALIBRATION_RATE}/2x1"),
                                        ("shared-memory", "shared-memory/1x2"))}
    table = []
    for rate_dir in sorted((out / "runs").iterdir()):
        rate = rate_dir.name
        overlap, overlap_slowed = overlaps["shared-memory" if rate == "shared-memory"
                                          else "network"]
        mean, mean_slowed = (statistics.mean(o.values()) for o in (overlap, overlap_slowed))
        net = calibrated
        if rate not in (CALIBRATION_RATE, "shared-memory"):
            factor = units.rate_bits(CALIBRATION_RATE) / units.rate_bits(rate)
            net = replace(net, inter=replace(net.inter, beta=net.inter.beta * factor),
                          exchange_inter=replace(net.exchange_inter,
                                                 beta=net.exchange_inter.beta * factor))
        for layout_dir in sorted(rate_dir.iterdir()):
            m, s = map(int, layout_dir.name.split("x"))
            found, _ = load_results([layout_dir])
            runs = [r for r in found if r.kind == "run"]
            for strategy_name in sorted({r.doc["config"]["dist_optimizer"] for r in runs}):
                mine = [r for r in runs if r.doc["config"]["dist_optimizer"] == strategy_name]
                n = m * s
                computes = {n: compute.measured(
                    [t for r in mine for t in _flat(r.doc["samples"]["reference_batch_seconds"])],
                    [t for r in mine for t in _flat(r.doc["samples"]["reference_phase_seconds"])],
                    grads.forward_share, "in-job reference")}
                inputs = Inputs(32, grads, net, s, computes, ("ring",), overlap=mean,
                                overlaps=overlap, pipeline_bytes=PIPELINE_BYTES["gloo"])
                strategy = Strategy(strategy_name)
                (row,) = project([strategy], [n], inputs)
                (full,) = project([strategy], [n], replace(inputs, overlap=1.0, overlaps={}))
                (slowed,) = project([strategy], [n], replace(inputs, overlap=mean_slowed,
                                                             overlaps=overlap_slowed))
                totals = [r.doc["summary"]["total_img_sec"]["mean"] for r in mine]
                measured = statistics.mean(totals)
                ci = _ci(totals)
                c = computes[n]
                linear = n * 32 / c.seconds
                naive = n * 32 / (c.seconds + _bytes_on_busiest_link(
                    strategy, costs.Layout(n, s), grads.total) / (units.rate_bits(rate) / 8
                                                                  if m > 1 else 1 / net.intra.beta))
                table.append({
                    "network": rate, "layout": f"{m}x{s}", "strategy": strategy_name,
                    "measured": measured, "ci95": ci, "runs": len(totals),
                    "projected": row.img_sec, "band": [row.low, row.high],
                    "with_stragglers": slowed.with_stragglers,
                    "error": row.img_sec / measured - 1,
                    "full_overlap_error": full.img_sec / measured - 1,
                    "error_with_stragglers": (slowed.with_stragglers / measured - 1
                                              if slowed.with_stragglers else None),
                    "linear_error": linear / measured - 1, "naive_error": naive / measured - 1,
                    "held_out": rate not in (CALIBRATION_RATE, "shared-memory"),
                    "calibration_point": (rate, m, s) in ((CALIBRATION_RATE, 2, 1),
                                                          ("shared-memory", 1, 2))})
    (out / "validation.json").write_text(json.dumps(table, indent=1))
    print(f"{'network':<14}{'layout':<7}{'strategy':<33}{'measured':>16}{'projected':>10}"
          f"{'error':>8}{'w/ strag':>9}{'overlap 1':>10}{'linear':>8}{'naive':>8}")
    for r in table:
        note = " (calibration point)" if r["calibration_point"] else \
            " (held-out rate)" if r["held_out"] else ""
        ci = f"±{r['ci95']:.1f}" if r["ci95"] is not None else ""
        strag = "-" if r["error_with_stragglers"] is None else f"{100 * r['error_with_stragglers']:+.0f}%"
        print(f"{r['network']:<14}{r['layout']:<7}{r['strategy']:<33}"
              f"{r['measured']:>9.1f}{ci:>7}{r['projected']:>10.1f}{100 * r['error']:>+7.0f}%"
              f"{strag:>9}{100 * r['full_overlap_error']:>+9.0f}%"
              f"{100 * r['linear_error']:>+7.0f}%{100 * r['naive_error']:>+7.0f}%{note}")
    print()
    scored = [r for r in table if not r["calibration_point"]]
    for strategy_name in sorted({r["strategy"] for r in scored}):
        errors = [abs(r["error"]) for r in scored if r["strategy"] == strategy_name]
        linear = [abs(r["linear_error"]) for r in scored if r["strategy"] == strategy_name]
        naive = [abs(r["naive_error"]) for r in scored if r["strategy"] == strategy_name]
        slowed = [abs(r["error_with_stragglers"]) for r in scored
                  if r["strategy"] == strategy_name]
        print(f"{strategy_name:<33} |error| median {100 * statistics.median(errors):4.1f}% "
              f"worst {100 * max(errors):4.1f}%; with stragglers median "
              f"{100 * statistics.median(slowed):4.1f}% worst {100 * max(slowed):4.1f}%; "
              f"linear median {100 * statistics.median(linear):5.1f}%, naive median "
              f"{100 * statistics.median(naive):4.1f}% ({len(errors)} points)")
    for kind, (overlap, overlap_slowed) in overlaps.items():
        print(f"overlap efficiency fitted at the {kind} calibration point: " + ", ".join(
            f"{k} {v:.2f} ({overlap_slowed[k]:.2f} with the straggler term)"
            for k, v in overlap.items()) + "; others their mean")
    print(f"links fitted: inter {calibrated.inter.describe()}; exchange inter "
          f"{calibrated.exchange_inter.describe()}; intra {calibrated.intra.describe()}")
    print(f"analysed in {time.monotonic() - begin:.1f} s")
    draw(table, out / "validation.png")


def draw(table, path: Path) -> None:
    """Projected against measured img/sec, without and with the straggler term: one
    marker per strategy, hollow at the calibration point, a colour per network; the
    measurement's 95% interval as bars."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.5, 5.4), layout="constrained")
    markers = {"allreduce": "o", "neighbor_allreduce": "s",
               "hierarchical_neighbor_allreduce": "D"}
    colors = {"shared-memory": "C2", CALIBRATION_RATE: "C0", HELD_OUT_RATE: "C3"}
    top = 1.15 * max(max(r["measured"], r["projected"], r["with_stragglers"] or 0)
                     for r in table)
    for ax, key, title in zip(fig.subplots(1, 2), ("projected", "with_stragglers"),
                              ("the model", "the model with its straggler term")):
        for r in table:
            if r[key] is None:
                continue
            ax.errorbar(r["measured"], r[key], xerr=min(r["ci95"] or 0, r["measured"]),
                        fmt=markers[r["strategy"]], color=colors[r["network"]],
                        mfc="none" if r["calibration_point"] else colors[r["network"]],
                        capsize=2, elinewidth=0.7)
            ax.annotate(r["layout"], (r["measured"], r[key]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
        ax.plot([0, top], [0, top], color="0.5", linewidth=0.8)
        for bound in (0.8, 1.2):
            ax.plot([0, top], [0, bound * top], ":", color="0.7", linewidth=0.8)
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel("measured total img/sec (bars: 95% CI over repeats)")
        ax.set_ylabel("projected total img/sec")
        ax.set_title(title, fontsize=9)
    for name, marker in markers.items():
        ax.plot([], [], marker, color="0.3", label=name)
    for network, color in colors.items():
        ax.plot([], [], "s", color=color, label=network)
    ax.plot([], [], "o", mfc="none", color="0.3", label="calibration point")
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("commbench simulate against emulated-cluster and shared-memory runs "
                 "(resnet18 32 px, CPU workers on 2 host cores; dotted: ±20%)", fontsize=9)
    fig.savefig(path, dpi=110)
    print(f"chart: {path}")


def fit_overlap_at(directory, net, grads, stragglers: bool):
    """Per strategy, the overlap efficiency that meets its runs in `directory` (a
    calibration layout), for the model with or without its straggler term."""
    from commbench.results import load_results
    from commbench.simulate import compute
    from commbench.simulate.project import Inputs, fit_overlap
    from commbench.simulate.step import Strategy

    found, _ = load_results([directory])
    fits = {}
    for name in sorted({r.doc["config"]["dist_optimizer"] for r in found}):
        mine = [r for r in found if r.doc["config"]["dist_optimizer"] == name]
        c = compute.measured(
            [t for r in mine for t in _flat(r.doc["samples"]["reference_batch_seconds"])],
            [t for r in mine for t in _flat(r.doc["samples"]["reference_phase_seconds"])],
            grads.forward_share, "in-job reference")
        measured = statistics.mean(r.doc["summary"]["total_img_sec"]["mean"] for r in mine)
        per_machine = int(mine[0].doc["environment"]["local_size"])
        inputs = Inputs(32, grads, net, per_machine, {2: c}, ("ring",),
                        measured={(Strategy(name).label(), 2): (measured, None)},
                        pipeline_bytes=PIPELINE_BYTES["gloo"])
        fits.update(fit_overlap([Strategy(name)], 2, inputs, stragglers))
    return fits


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


def _flat(nested):
    import numpy as np

    return np.ravel(nested).tolist() if nested else []


def _ci(values):
    from commbench import metrics

    return metrics.ci95_halfwidth(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("collect", "analyse"))
    parser.add_argument("--out", default="simulate-validation", type=Path)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="rounds of runs to collect")
    parser.add_argument("--runs-only", action="store_true",
                        help="collect runs only: add repeats to an earlier collection")
    args = parser.parse_args()
    if args.step == "collect":
        collect(args.out, args.repeats, args.runs_only)
    else:
        analyse(args.out)


if __name__ == "__main__":
    main()
