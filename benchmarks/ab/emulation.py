"""What does the emulation itself cost? The same 1-machine job (2 ranks, shared memory
between them) inside an emulated machine (`mpirun -H NAME-m0:2` through the cluster's
ssh, in the machine's namespaces) and outside it (`mpiexec -n 2`), in paired rounds
whose order alternates (outside first, then inside first), so that the machine's own
drift, which is slow next to one short job, cancels within a pair and the order
favours neither; prints each round's total img/sec and the ratio inside/outside
(median of the paired rounds, and the 95% interval of their geometric mean). Needs
root.

With --together both jobs run at the same time, sharing the cores, so that the
machine's drift hits both alike within every round; each job's speed is then its
median batch (the few batches one job runs alone, while the other starts or ends,
do not move a median), and the jobs measure --num-iters 60 by default.

    python benchmarks/ab/ab.py emulation [--rounds 3] [--together] [run flags]

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

from commbench.cluster import namespaces
from paired import interval

RUN = ["--dist-optimizer=allreduce", "--model", "squeezenet1_1", "--image-size", "32",
       "--batch-size", "16", "--num-warmup-batches", "20", "--num-batches-per-iter", "5",
       "--num-iters", "10", "--reference-seconds", "0"]


def start(launch, flags, directory: Path, path_first=None) -> subprocess.Popen:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    if path_first:
        env["PATH"] = f"{path_first}{os.pathsep}{env['PATH']}"
    directory.mkdir(parents=True)
    return subprocess.Popen([*launch, sys.executable, "-m", "commbench", *flags,
                             "--results-dir", str(directory)], env=env,
                            stdout=subprocess.DEVNULL)


def speed(job: subprocess.Popen, directory: Path, by_median: bool) -> float:
    if job.wait() != 0:
        raise SystemExit(f"a job failed (exit {job.returncode})")
    (found,) = directory.glob("*.json")
    doc = json.loads(found.read_text())
    if not by_median:
        return doc["summary"]["total_img_sec"]["mean"]
    batch = doc["config"]["batch_size"] * doc["environment"]["world_size"]
    return batch / doc["summary"]["latency_seconds_per_batch"]["p50"]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="ab.py emulation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--together", action="store_true",
                        help="run the two jobs at the same time in every round")
    args, extra = parser.parse_known_args(argv)
    flags = RUN + (["--num-iters", "60"] if args.together else []) + extra
    name = f"o{os.getpid() % 10**6}"
    cluster = namespaces.up(name, 1, 2, "10gbit")
    ratios = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for r in range(args.rounds):
                where = {"outside": Path(scratch) / f"out{r}", "inside": Path(scratch) / f"in{r}"}
                arms = {
                    "outside": lambda: start(["mpiexec", "-n", "2", "--bind-to", "none"], flags,
                                             where["outside"]),
                    "inside": lambda: start(["mpirun", "-H", cluster.hosts, "-np", "2",
                                             "--bind-to", "none"], flags, where["inside"],
                                            str(cluster.bin)),
                }
                order = list(arms) if r % 2 == 0 else list(arms)[::-1]
                if args.together:
                    jobs = {arm: arms[arm]() for arm in order}
                    got = {arm: speed(job, where[arm], True) for arm, job in jobs.items()}
                else:
                    got = {arm: speed(arms[arm](), where[arm], False) for arm in order}
                outside, inside = got["outside"], got["inside"]
                ratios.append(inside / outside)
                print(f"round {r + 1}: outside {outside:.1f} img/s, inside {inside:.1f} img/s, "
                      f"ratio {inside / outside:.3f}", flush=True)
    finally:
        namespaces.down(name)
    low, high = interval(ratios)
    print(f"inside/outside, median of {len(ratios)} paired rounds: "
          f"{statistics.median(ratios):.3f}; 95% CI of the geometric mean {low:.3f}..{high:.3f} "
          f"(target >= 0.95)")
    if low < 0.95 < high:
        print("NOT DECIDED: the interval spans the target; the machine's noise is larger than "
              "the effect (more --rounds, a quieter machine)")

