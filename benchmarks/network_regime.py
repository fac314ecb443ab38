"""Which strategy wins where the network binds? One command: resnet18 at 32 px on
emulated clusters of 2 machines x 2 ranks and 4 x 1, at each --link rate, for
allreduce, horovod, neighbor_allreduce (one-peer dynamic, and static exponential-2),
hierarchical_neighbor_allreduce, and the compute-only `none` on one worker as Total(1).
Every job is a `commbench sweep --emulate` job (same commands), and around each one the
bytes its machines sent over their links are read from the links' counters, so the
table shows what each strategy moved per step, measured, beside its img/sec. Then
`commbench report` and `commbench plot` of the runs. Needs root.

    python benchmarks/network_regime.py [--link 1gbit,200mbit] [--out network-regime]

The charts land in OUT/charts (one per link rate); the README shows them.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from commbench.cluster import network
from commbench.results import read_result
from commbench.sweep import _cluster_shape, _job_environment, _run_one, plan_emulated

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
    args = parser.parse_args()
    out = Path(args.out)
    results = str(out / "results")
    name = f"n{os.getpid() % 10**6}"
    links = args.link.split(",")
    jobs = plan_emulated([(1, 1)], links, name, ["none"], MODEL, results)
    jobs += plan_emulated(LAYOUTS, links, name, STRATEGIES, MODEL, results)
    jobs += plan_emulated(LAYOUTS, links, name, ["neighbor_allreduce"],
                          MODEL + ["--disable-dynamic-topology"], results)
    shape = _cluster_shape(LAYOUTS)
    env = _job_environment()
    rows = []
    for link in links:
        cluster = network.up(name, *shape, link)
        try:
            path = f"{cluster.bin}{os.pathsep}{env['PATH']}"
            for job in (j for j in jobs if j.link == link):
                before = sent_bytes(cluster)
                output = _run_one(job, 1800, {**env, "PATH": path})
                moved = sent_bytes(cluster) - before
                if not job.ok:
                    print(f"FAILED {job.strategy} on {job.workers}:\n{output[-2000:]}")
                    continue
                rows.append((link, job, moved))
                print(f"{link} {job.command[2]:>40} {job.strategy}: {job.headline}",
                      flush=True)
        finally:
            network.down(name)
    print()
    print(f"{'link':<8} {'layout':<7} {'strategy':<44} {'img/s':>7} {'MB/step/machine':>16}")
    for link, job, moved in rows:
        doc = read_result(job.result)
        config, summary = doc["config"], doc["summary"]
        steps = config["num_warmup_batches"] + config["num_iters"] * config["num_batches_per_iter"]
        machines = len(set(doc["environment"]["hostnames"]))
        label = job.strategy + (" (static)" if "--disable-dynamic-topology" in job.command else "")
        layout = f"{machines}x{job.workers // machines}"
        print(f"{link:<8} {layout:<7} {label:<44} {summary['total_img_sec']['mean']:7.1f} "
              f"{moved / steps / machines / 1e6:16.1f}")
    made = [str(job.result) for _, job, _ in rows]
    subprocess.run([sys.executable, "-m", "commbench", "report", *made], check=False)
    subprocess.run([sys.executable, "-m", "commbench", "plot", *made, "-o",
                    str(out / "charts")], check=False)


if __name__ == "__main__":
    main()
