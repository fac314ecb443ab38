"""Every strategy at link rate between machines? On emulated clusters (--layouts, e.g.
2x1 = 2 machines of 1 rank) at each --links rate, `commbench microbench` with default
flags measures commbench's allreduce, neighbor_allreduce (exponential-2, dynamic
one-peer and static) and hierarchical_neighbor_allreduce against their raw contenders
(gloo, MPI) at --size per rank. For every contender it prints the machine's link as
its interface counted it (bytes that left each machine per second, headers included,
over the configured rate: the figure on layouts where ranks share a machine), the
payload figure (busbw for allreduce, per-link bandwidth for neighbor exchanges) over
the rate, and commbench's time against the best raw contender's in the same run
(interleaved calls). Needs root.

    python benchmarks/diagnostics/cluster_link.py [--links 200mbit,1gbit]
        [--layouts 2x1,2x2,4x1,4x2] [--size 64M] [--small 64K] [--cases horovod]
        [--mpirun-args "--mca coll ^han"]

Horovod's allreduce (`microbench --op horovod`) runs under mpirun (its MPI controller
and CPU operations) and under `horovodrun --gloo` (its gloo ones), where installed.

Targets (issue: every strategy at link rate): at --size, commbench's link figure
>= 0.90x the rate and its time within 1/0.98 of the best raw contender's; at --small,
no slower than MPI's Allreduce (what `auto` used between machines before).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commbench import units
from commbench.result import metrics
from commbench.cluster import namespaces

ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# (op, label, flags, launcher): horovod under mpirun runs Horovod's MPI controller and
# CPU operations, under `horovodrun --gloo` its gloo ones.
CASES = [("allreduce", "allreduce", [], "mpirun"),
         ("neighbor_allreduce", "neighbor_allreduce one-peer", [], "mpirun"),
         ("neighbor_allreduce", "neighbor_allreduce static", ["--disable-dynamic-topology"],
          "mpirun"),
         ("hierarchical_neighbor_allreduce", "hierarchical", [], "mpirun"),
         ("horovod", "horovod (MPI)", [], "mpirun"),
         ("horovod", "horovod (gloo)", [], "horovodrun --gloo")]


def microbench(cluster, n, op, flags, size, iters, directory: Path, launcher="mpirun",
               mpirun_args=()):
    env = dict(os.environ, **ROOT_OK)
    # the cluster's ssh, then this environment's horovodrun and mpirun
    env["PATH"] = os.pathsep.join([str(cluster.bin), str(Path(sys.executable).parent), env["PATH"]])
    start = ["mpirun", "-H", cluster.hosts, "-np", str(n), "--bind-to", "none", *mpirun_args] \
        if launcher == "mpirun" else [*launcher.split(), "-H", cluster.hosts, "-np", str(n)]
    subprocess.run([*start, sys.executable, "-m", "commbench", "microbench", "--op", op,
                    "-b", size, "-e", size, "-n", str(iters), "-w", "1", "-c", "0", *flags,
                    "--results-dir", str(directory)], check=True, env=env,
                   stdout=subprocess.DEVNULL, timeout=1800)
    (found,) = directory.glob("*.json")
    return json.loads(found.read_text())["rows"]


def report(label, rows, rate):
    ours = rows[0]
    for row in rows:
        s = row["summary"]
        payload = s.get("busbw") or s.get("link_bw")
        if row["impl"] == "combine only":
            continue  # no communication
        versus = metrics.paired_ratio(row["seconds"], ours["seconds"]) \
            if row is not ours else None
        print(f"  {label:<28} {row['impl']:<34} {s.get('link_fraction') or float('nan'):6.2f} "
              f"{payload / rate:8.2f} {'' if versus is None else f'{versus:9.2f}':>9}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", default="200mbit,1gbit")
    parser.add_argument("--layouts", default="2x1,2x2,4x1,4x2")
    parser.add_argument("--size", default="64M")
    parser.add_argument("--small", default="64K")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--cases", help="only the cases whose label starts with one of "
                        "these, e.g. horovod")
    parser.add_argument("--mpirun-args", default="", help="more mpirun flags, e.g. "
                        "'--mca coll ^han'")
    args = parser.parse_args()
    started = time.monotonic()
    print(f"size {args.size} per rank (small: {args.small}); columns: x rate = bytes out of "
          "each machine's interface / configured rate; payload = busbw or per-link bw / "
          "rate; raw/ours = the raw contender's time / commbench's, median of "
          "the calls' paired ratios (> 1: ours faster)")
    for link in args.links.split(","):
        rate = units.rate_bits(link, "--links") / 8
        for layout in args.layouts.split(","):
            machines, slots = (int(v) for v in layout.split("x"))
            name = f"b{os.getpid() % 10**5}"
            print(f"\n{layout} at {link}:\n  {'case':<28} {'contender':<34} {'x rate':>6} "
                  f"{'payload':>8} {'raw/ours':>9}")
            cluster = namespaces.up(name, machines, slots, link)
            try:
                with tempfile.TemporaryDirectory() as scratch:
                    for i, (op, label, flags, launcher) in enumerate(CASES):
                        if op == "hierarchical_neighbor_allreduce" and slots == 1:
                            continue  # plain neighbor averaging between machines
                        if args.cases and not label.startswith(tuple(args.cases.split(","))):
                            continue
                        for size, tag in ((args.size, ""), (args.small, " small")):
                            rows = microbench(cluster, machines * slots, op, flags, size,
                                              args.iters if not tag else 20,
                                              Path(scratch) / f"{i}{tag}", launcher,
                                              shlex.split(args.mpirun_args))
                            report(label + tag, rows, rate)
            finally:
                namespaces.down(name)
    print(f"\nwall time {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
