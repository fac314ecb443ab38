"""What does the emulation itself cost? The same 1-machine job (2 ranks, shared memory
between them) inside an emulated machine (`mpirun -H NAME-m0:2` through the cluster's
ssh, in the machine's namespaces) and outside it (`mpiexec -n 2`), alternating rounds;
prints each round's total img/sec and the ratio inside/outside (median of the paired
rounds). Needs root.

    python benchmarks/emulation_overhead.py [--rounds 3] [run flags]

Target (issue: commbench cluster): >= 0.95.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from commbench.cluster import network

RUN = ["--dist-optimizer=allreduce", "--model", "squeezenet1_1", "--image-size", "32",
       "--batch-size", "16", "--num-warmup-batches", "20", "--num-batches-per-iter", "5",
       "--num-iters", "10", "--reference-seconds", "0"]


def total(launch, flags, directory: Path, path_first=None) -> float:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    if path_first:
        env["PATH"] = f"{path_first}{os.pathsep}{env['PATH']}"
    directory.mkdir(parents=True)
    subprocess.run([*launch, sys.executable, "-m", "commbench", *flags, "--results-dir",
                    str(directory)], check=True, env=env, stdout=subprocess.DEVNULL)
    (found,) = directory.glob("*.json")
    return json.loads(found.read_text())["summary"]["total_img_sec"]["mean"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args, extra = parser.parse_known_args()
    flags = RUN + extra
    name = f"o{os.getpid() % 10**6}"
    cluster = network.up(name, 1, 2, "10gbit")
    ratios = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for r in range(args.rounds):
                outside = total(["mpiexec", "-n", "2", "--bind-to", "none"], flags,
                                Path(scratch) / f"out{r}")
                inside = total(["mpirun", "-H", cluster.hosts, "-np", "2", "--bind-to", "none"],
                               flags, Path(scratch) / f"in{r}", str(cluster.bin))
                ratios.append(inside / outside)
                print(f"round {r + 1}: outside {outside:.1f} img/s, inside {inside:.1f} img/s, "
                      f"ratio {inside / outside:.3f}", flush=True)
    finally:
        network.down(name)
    low, high = interval(ratios)
    print(f"inside/outside, median of {len(ratios)} paired rounds: "
          f"{statistics.median(ratios):.3f}; 95% CI of the geometric mean {low:.3f}..{high:.3f} "
          f"(target >= 0.95)")
    if low < 0.95 < high:
        print("NOT DECIDED: the interval spans the target; the machine's noise is larger than "
              "the effect (more --rounds, a quieter machine)")


def interval(ratios):
    """95% CI of the geometric mean ratio (t on the log ratios)."""
    import math

    from scipy import stats

    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return ratios[0], ratios[0]
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.mean(logs)
    return math.exp(mean - half), math.exp(mean + half)


if __name__ == "__main__":
    main()
