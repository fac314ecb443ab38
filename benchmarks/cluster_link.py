"""Is an emulated cluster's link real? On 2 emulated machines (1 rank each) at --link,
`commbench microbench` measures allreduce busbw for every contender (commbench's,
torch/gloo's, MPI's) and neighbor exchange bandwidth at --size; then the same job on
shared memory (`mpiexec -n 2`, no cluster). Prints each figure against the configured
rate, and how many times slower the link is than shared memory. Needs root.

    python benchmarks/cluster_link.py [--link 200mbit] [--size 64M]

Target (issue: commbench cluster): allreduce busbw at 64 MB within 0.85-1.05x of the
configured rate, and at least 10x below the same job on shared memory.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from commbench import units
from commbench.cluster import namespaces

ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def microbench(launch, size, directory: Path, path_first=None):
    env = dict(os.environ, **ROOT_OK)
    if path_first:
        env["PATH"] = f"{path_first}{os.pathsep}{env['PATH']}"
    subprocess.run([*launch, sys.executable, "-m", "commbench", "microbench", "--op",
                    "allreduce,neighbor_allreduce", "-b", size, "-e", size, "-n", "5", "-w",
                    "1", "-c", "0", "--results-dir", str(directory)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    (found,) = directory.glob("*.json")
    rows = json.loads(found.read_text())["rows"]
    return {(r["op"], r["impl"]): r["summary"] for r in rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", default="200mbit")
    parser.add_argument("--size", default="64M")
    args = parser.parse_args()
    rate = units.rate_bits(args.link, "--link") / 8  # bytes/s
    name = f"b{os.getpid() % 10**6}"
    with tempfile.TemporaryDirectory() as scratch:
        cluster = namespaces.up(name, 2, 1, args.link)
        try:
            linked = microbench(["mpirun", "-H", cluster.hosts, "-np", "2", "--bind-to", "none"],
                                args.size, Path(scratch) / "link", str(cluster.bin))
        finally:
            namespaces.down(name)
        shared = microbench(["mpiexec", "-n", "2"], args.size, Path(scratch) / "shm")
    print(f"2 emulated machines at {args.link} ({rate / 1e6:.1f} MB/s), {args.size} per rank")
    print(f"{'op':<20} {'contender':<34} {'GB/s':>8} {'x rate':>7} {'shm GB/s':>9} {'shm/link':>9}")
    for key, summary in linked.items():
        bw = summary.get("busbw") or summary.get("algbw")
        if "combine only" in key[1]:
            continue  # no communication
        shm = (shared.get(key) or {}).get("busbw") or (shared.get(key) or {}).get("algbw")
        print(f"{key[0]:<20} {key[1]:<34} {bw / 1e9:8.4f} {bw / rate:7.2f} "
              f"{shm / 1e9 if shm else float('nan'):9.3f} {shm / bw if shm else float('nan'):9.1f}")


if __name__ == "__main__":
    main()
