"""Which strategy wins where the network binds? One command: resnet18 at 32 px on
emulated clusters of 2 machines x 2 ranks and 4 x 1, at each --link rate, for
allreduce, horovod, neighbor_allreduce (one-peer dynamic, and static exponential-2),
hierarchical_neighbor_allreduce, and the compute-only `none` on one worker as Total(1).
Every job is a `commbench sweep --emulate` job (same commands), and around each one the
bytes its machines sent over their links are read from the links' counters, so the
table shows what each strategy moved per step, measured, beside its img/sec. Then
`commbench report` and `commbench plot` of the runs. Needs root.

    python benchmarks/network_regime.py [--link 1gbit,200mbit] [--out network-regime]

The charts land in OUT/charts (one per link rate); docs/cluster.md shows them.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from commbench.cluster import namespaces
from commbench.results import read_result
from commbench.sweep.execute import job_environment, run_one
from commbench.sweep.plan import cluster_shape, plan_emulated

MODEL = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32",
         "--num-warmup-batches", "3", "--num-batches-per-iter", "3", "--num-iters", "6",
         "--reference-iters", "2", "--reference-seconds", "0.5", "--cpu-transport", "gloo"]
LAYOUTS = [(2, 2), (4, 1)]
STRATEGIES = ["allreduce", "horovod", "neighbor_allreduce", "hierarchical_neighbor_allreduce"]


def sent_bytes(cluster) -> int:
    """Bytes all machines have sent over their links so far."""
    total = 0
    for i in range(cluster.machines):
        out = subprocess.run(["ip", "-n", cluster.netns(i), "-j", "-s", "link", "show",
                              cluster.nic], capture_output=True, text=True, check=True).stdout
        total += json.loads(out)[0]["stats64"]["tx"]["bytes"]
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", default="1gbit,200mbit")
    parser.add_argument("--out", default="network-regime")
    parser.add_argument("--draw-only", action="store_true",
                        help="redraw OUT/network-regime.png from OUT/table.json")
    args = parser.parse_args()
    out = Path(args.out)
    if args.draw_only:
        draw(json.loads((out / "table.json").read_text()), out / "network-regime.png")
        return
    results = str(out / "results")
    name = f"n{os.getpid() % 10**6}"
    links = args.link.split(",")
    jobs = plan_emulated([(1, 1)], links, name, ["none"], MODEL, results)
    jobs += plan_emulated(LAYOUTS, links, name, STRATEGIES, MODEL, results)
    jobs += plan_emulated(LAYOUTS, links, name, ["neighbor_allreduce"],
                          MODEL + ["--disable-dynamic-topology"], results)
    shape = cluster_shape(LAYOUTS)
    env = job_environment()
    rows = []
    for link in links:
        cluster = namespaces.up(name, *shape, link)
        try:
            path = f"{cluster.bin}{os.pathsep}{env['PATH']}"
            for job in (j for j in jobs if j.link == link):
                before = sent_bytes(cluster)
                output = run_one(job, 1800, {**env, "PATH": path})
                moved = sent_bytes(cluster) - before
                if not job.ok:
                    print(f"FAILED {job.strategy} on {job.workers}:\n{output[-2000:]}")
                    continue
                rows.append((link, job, moved))
                print(f"{link} {job.command[2]:>40} {job.strategy}: {job.headline}",
                      flush=True)
        finally:
            namespaces.down(name)
    table = []
    for link, job, moved in rows:
        doc = read_result(job.result)
        config, summary = doc["config"], doc["summary"]
        steps = config["num_warmup_batches"] + config["num_iters"] * config["num_batches_per_iter"]
        machines = len(set(doc["environment"]["hostnames"]))
        label = job.strategy + (" (static)" if "--disable-dynamic-topology" in job.command else "")
        table.append({"link": link, "layout": f"{machines}x{job.workers // machines}",
                      "strategy": label, "img_sec": summary["total_img_sec"]["mean"],
                      "ci95": summary["total_img_sec"].get("ci95"),
                      "mb_per_step_per_machine": moved / steps / machines / 1e6})
    (out / "table.json").write_text(json.dumps(table, indent=1))
    print()
    print(f"{'link':<8} {'layout':<7} {'strategy':<44} {'img/s':>7} {'MB/step/machine':>16}")
    for row in table:
        print(f"{row['link']:<8} {row['layout']:<7} {row['strategy']:<44} {row['img_sec']:7.1f} "
              f"{row['mb_per_step_per_machine']:16.1f}")
    print("MB/step/machine: bytes the machines sent over their links during the job, per "
          "machine and training step: the strategy's own traffic plus start-up and "
          "commbench's once-per-iteration consensus measurement (decentralized strategies).")
    draw(table, out / "network-regime.png")
    made = [str(job.result) for _, job, _ in rows]
    subprocess.run([sys.executable, "-m", "commbench", "report", *made], check=False)
    subprocess.run([sys.executable, "-m", "commbench", "plot", *made, "-o",
                    str(out / "charts")], check=False)


def draw(table, path: Path) -> None:
    """Bars of total img/sec per strategy, one panel per link rate, one bar per layout,
    each labelled with the MB its machines sent per step."""
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
