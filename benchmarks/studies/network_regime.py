"""Which strategy wins where the network binds? One command: resnet18 at 32 px on
emulated clusters of 2 machines x 2 ranks and 4 x 1, at each --link rate, for
allreduce, horovod, neighbor_allreduce (one-peer dynamic, and static exponential-2),
hierarchical_neighbor_allreduce, and the compute-only `none` on one worker as Total(1).
Every job is a `commbench sweep --emulate` job (same commands), and around each one the
bytes its machines sent over their links are read from the links' counters, so the
table shows what each strategy moved per step, measured, beside its img/sec. Then
`commbench report` and `commbench plot` of the runs. Every job runs with default flags
(`--cpu-transport auto`: gloo between machines, MPI on one).
Needs root.

    python benchmarks/studies/network_regime.py [--link 1gbit,200mbit] [--out network-regime]
                                        [--compare-forced-gloo]
                                        [--layouts 2x2,4x1] [--strategies ...]

--layouts and --strategies run a part of the study (e.g. `--layouts 2x1 --strategies
allreduce`: the end-to-end step of allreduce between two machines; the table's
"link/step" column is the bytes each machine sent per step over the step time, as a
fraction of the rate).

--compare-forced-gloo runs, right beside each job (which of the two goes first
alternates), the same job with `--cpu-transport gloo` (how this study was run before
`auto` picked per path) and prints both step times per strategy and whether the
strategies rank the same way, or differ only within the noise (their img/sec
intervals overlap). `horovod` has no --cpu-transport: its pair is the same job twice,
which shows the noise of one run.

The chart and table land in OUT/network-regime.png and OUT/table.json (`--draw-only`
redraws the chart); `commbench plot`'s charts in OUT/charts. docs/cluster.md shows them.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from commbench import units
from commbench.cluster import namespaces
from commbench.result.store import read_result
from commbench.sweep.execute import job_environment, run_one
from commbench.sweep.plan import cluster_shape, plan_emulated

MODEL = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32",
         "--num-warmup-batches", "3", "--num-batches-per-iter", "3", "--num-iters", "6",
         "--reference-iters", "2", "--reference-seconds", "0.5"]
FORCED = ["--cpu-transport", "gloo"]
LAYOUTS = [(2, 2), (4, 1)]
STRATEGIES = ["allreduce", "horovod", "neighbor_allreduce", "hierarchical_neighbor_allreduce"]


def plan(links, name, flags, results, layouts=LAYOUTS, strategies=STRATEGIES):
    jobs = plan_emulated([(1, 1)], links, name, ["none"], MODEL + flags, results)
    jobs += plan_emulated(layouts, links, name, strategies, MODEL + flags, results)
    if "neighbor_allreduce" in strategies:
        jobs += plan_emulated(layouts, links, name, ["neighbor_allreduce"],
                              MODEL + flags + ["--disable-dynamic-topology"], results)
    return jobs


def main():
    args = parse_args()
    out = Path(args.out)
    if args.draw_only:
        redraw(out)
        return
    name = f"n{os.getpid() % 10**6}"
    links = args.link.split(",")
    layouts = [tuple(int(v) for v in layout.split("x")) for layout in args.layouts.split(",")]
    strategies = args.strategies.split(",")
    jobs = plan(links, name, [], str(out / "results"), layouts, strategies)
    # The same jobs in the same order, forced onto gloo (not the compute-only `none`).
    forced = plan(links, name, FORCED, str(out / "results-forced-gloo"), layouts, strategies) \
        if args.compare_forced_gloo else [None] * len(jobs)
    shape = cluster_shape(layouts)
    env = job_environment()
    started = time.monotonic()
    pairs = list(zip(jobs, forced))
    rows = [row for link in links for row in run_at(link, name, shape, env, pairs, started)]
    table = [entry(link, job, moved, other, other_moved)
             for link, job, moved, other, other_moved in rows]
    (out / "table.json").write_text(json.dumps(table, indent=1))
    print_table(table)
    if args.compare_forced_gloo:
        compare(table)
    draw(table, out / "network-regime.png")
    made = [str(job.result) for _, job, _, _, _ in rows]
    subprocess.run([sys.executable, "-m", "commbench", "report", *made], check=False)
    subprocess.run([sys.executable, "-m", "commbench", "plot", *made, "-o",
                    str(out / "charts")], check=False)
    print(f"wall time {(time.monotonic() - started) / 60:.0f} min")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", default="1gbit,200mbit")
    parser.add_argument("--out", default="network-regime")
    parser.add_argument("--compare-forced-gloo", action="store_true",
                        help="beside each job, the same job with --cpu-transport gloo")
    parser.add_argument("--layouts", default=",".join(f"{m}x{s}" for m, s in LAYOUTS),
                        help="machines x ranks per machine, e.g. 2x1,4x1")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--draw-only", action="store_true",
                        help="redraw OUT/network-regime.png (and print the comparison) "
                        "from OUT/table.json")
    return parser.parse_args()


def redraw(out: Path) -> None:
    """--draw-only: the chart, and the comparison where the table has forced-gloo pairs,
    from OUT/table.json."""
    table = json.loads((out / "table.json").read_text())
    if any("forced_gloo" in row for row in table):
        compare(table)
    draw(table, out / "network-regime.png")


def run_at(link, name, shape, env, pairs, started) -> list:
    """The jobs at `link` of `pairs` (job, its forced-gloo pair or None) on an emulated
    cluster built for them: a row (link, job, bytes sent, the pair where it ran well,
    its bytes sent) per job that ran well."""
    cluster = namespaces.up(name, *shape, link)
    rows = []
    try:
        path = f"{cluster.bin}{os.pathsep}{env['PATH']}"
        here = [(job, other) for job, other in pairs if job.link == link]
        for k, (job, other) in enumerate(here):
            arms = [job] if other is None or job.strategy == "none" else \
                [job, other][::1 if k % 2 == 0 else -1]  # who goes first alternates
            moved = run_arms(link, arms, other, cluster, {**env, "PATH": path}, started)
            if job.ok:
                rows.append((link, job, moved[id(job)], other if other is not None
                             and other.ok and id(other) in moved else None,
                             moved.get(id(other), 0)))
    finally:
        namespaces.down(name)
    return rows


def run_arms(link, arms, other, cluster, env, started) -> dict:
    """Each arm in turn, its headline printed: {id(arm): the bytes the machines sent
    during it}."""
    moved = {}
    for arm in arms:
        before = namespaces.sent_bytes(cluster)
        output = run_one(arm, 1800, env)
        moved[id(arm)] = namespaces.sent_bytes(cluster) - before
        tag = " [--cpu-transport gloo]" if arm is other else ""
        if not arm.ok:
            print(f"FAILED {arm.strategy}{tag} on {arm.workers}:\n{output[-2000:]}")
            continue
        print(f"{link} {arm.command[2]:>40} {arm.strategy}{tag}: {arm.headline} "
              f"({(time.monotonic() - started) / 60:.0f} min)", flush=True)
    return moved


def print_table(table) -> None:
    """Per job, its img/sec and the bytes its machines sent per step, also as a fraction
    of the link's rate."""
    print()
    print(f"{'link':<8} {'layout':<7} {'strategy':<44} {'img/s':>7} {'MB/step/machine':>16} "
          f"{'link/step':>9}")
    for row in table:
        rate = units.rate_bits(row["link"], "--link") / 8
        print(f"{row['link']:<8} {row['layout']:<7} {row['strategy']:<44} {row['img_sec']:7.1f} "
              f"{row['mb_per_step_per_machine']:16.1f} "
              f"{row['mb_per_step_per_machine'] * 1e6 / row['step_s'] / rate:9.2f}")
    print("MB/step/machine: bytes the machines sent over their links during the job, per "
          "machine and training step: the strategy's own traffic plus start-up and "
          "commbench's once-per-iteration consensus measurement (decentralized strategies).")


def entry(link, job, moved, other, other_moved) -> dict:
    """One row of table.json: the default job, and its forced-gloo pair where run."""
    doc = read_result(job.result)
    config, summary = doc["config"], doc["summary"]
    steps = config["num_warmup_batches"] + config["num_iters"] * config["num_batches_per_iter"]
    machines = len(set(doc["environment"]["hostnames"]))
    label = job.strategy + (" (static)" if "--disable-dynamic-topology" in job.command else "")
    row = {"link": link, "layout": f"{machines}x{job.workers // machines}",
           "strategy": label, "img_sec": summary["total_img_sec"]["mean"],
           "ci95": summary["total_img_sec"].get("ci95"),
           "step_s": summary["latency_seconds_per_batch"]["p50"],
           "transport": (doc.get("strategy") or {}).get("transport"),
           "mb_per_step_per_machine": moved / steps / machines / 1e6}
    if other is not None:
        forced = read_result(other.result)["summary"]
        row["forced_gloo"] = {"img_sec": forced["total_img_sec"]["mean"],
                              "ci95": forced["total_img_sec"].get("ci95"),
                              "step_s": forced["latency_seconds_per_batch"]["p50"],
                              "mb_per_step_per_machine": other_moved / steps / machines / 1e6}
    return row


def compare(table) -> None:
    """Default against forced gloo: step times per strategy, and per link and layout
    whether the strategies rank the same way; a pair that swaps is within the noise
    when, in either arm, the two img/sec intervals (mean +- ci95) overlap."""
    print("\ndefault (--cpu-transport auto) against forced --cpu-transport gloo, paired jobs:")
    print(f"{'link':<8} {'layout':<7} {'strategy':<34} {'auto picks':>10} {'step s':>7} "
          f"{'gloo step s':>11} {'auto/gloo img/s':>15}")
    groups = {}
    for row in table:
        if "forced_gloo" not in row:
            continue
        f = row["forced_gloo"]
        groups.setdefault((row["link"], row["layout"]), []).append(row)
        print(f"{row['link']:<8} {row['layout']:<7} {row['strategy']:<34} "
              f"{row['transport'] or '-':>10} {row['step_s']:7.2f} {f['step_s']:11.2f} "
              f"{row['img_sec'] / f['img_sec']:15.3f}")
    for (link, layout), rows in groups.items():
        by = {r["strategy"]: r for r in rows}
        default = sorted(by, key=lambda s: -by[s]["img_sec"])
        gloo = sorted(by, key=lambda s: -by[s]["forced_gloo"]["img_sec"])
        swaps = []
        for i, a in enumerate(default):
            for b in default[i + 1:]:
                if gloo.index(a) > gloo.index(b):
                    near = overlaps(by[a], by[b]) or overlaps(by[a]["forced_gloo"],
                                                              by[b]["forced_gloo"])
                    swaps.append(f"{a} / {b} ({'within' if near else 'BEYOND'} the noise)")
        verdict = "differs: " + "; ".join(swaps) if swaps else "the same"
        print(f"{link} {layout}: ranking {verdict} (default: {' > '.join(default)})")


def overlaps(a, b) -> bool:
    return abs(a["img_sec"] - b["img_sec"]) <= (a["ci95"] or 0) + (b["ci95"] or 0)


def draw(table, path: Path) -> None:
    """Bars of total img/sec per strategy, one panel per link rate, one bar per layout,
    each labelled with the MB its machines sent per step; a black dash on a bar: its
    job forced onto gloo (--compare-forced-gloo)."""
    from matplotlib.figure import Figure

    links = list(dict.fromkeys(r["link"] for r in table))
    strategies = [s for s in dict.fromkeys(r["strategy"] for r in table) if s != "none"]
    layouts = [layout for layout in dict.fromkeys(r["layout"] for r in table)
               if layout != "1x1"]
    fig = Figure(figsize=(6.5 * len(links), 4.8), layout="constrained")
    for ax, link in zip(fig.subplots(1, len(links), squeeze=False)[0], links):
        width = 0.8 / len(layouts)
        for k, layout in enumerate(layouts):
            rows = {r["strategy"]: r for r in table
                    if r["link"] == link and r["layout"] == layout}
            xs = [i + (k - (len(layouts) - 1) / 2) * width for i in range(len(strategies))]
            heights = [rows[s]["img_sec"] if s in rows else 0 for s in strategies]
            bars = ax.bar(xs, heights, width, label=f"{layout} (machines x ranks)",
                          yerr=[rows[s]["ci95"] or 0 if s in rows else 0 for s in strategies])
            ax.bar_label(bars, [f"{rows[s]['mb_per_step_per_machine']:.0f} MB" if s in rows
                                else "" for s in strategies], fontsize=7, padding=2)
            forced = [(x, rows[s]["forced_gloo"]["img_sec"]) for x, s in zip(xs, strategies)
                      if s in rows and "forced_gloo" in rows[s]]
            if forced:
                ax.plot(*zip(*forced), "k_", markersize=14, mew=2,
                        label="the same job, --cpu-transport gloo" if k == 0 else None)
        ax.set_xticks(range(len(strategies)),
                      [s.replace("_neighbor_allreduce", "_nar").replace(" (", "\n(")
                       for s in strategies], fontsize=8)
        ax.set_title(f"{link} links: total img/sec (label: MB sent per step per machine)",
                     fontsize=10)
        ax.set_ylabel("total img/sec, 4 workers")
        ax.legend(fontsize=8)
    fig.suptitle("resnet18 32 px, batch 32, 4 CPU workers on 2 host cores (oversubscribed: "
                 "compare strategies, not absolute speed)", fontsize=10)
    fig.savefig(path, dpi=110)
    print(f"chart: {path}")


if __name__ == "__main__":
    main()
