"""Which strategy reaches the target accuracy soonest? One command: --workers workers
train ResNet-18 at 32 px on the generated task to --target for each strategy and
partition, --repeat times with the seed varied (the same seed for every strategy of a
repeat), on shared memory or, with --emulate (needs root), on emulated clusters. Every
job is a `commbench sweep` job (the same commands a user types); then `commbench report`
of each partition's results prints time to target per strategy (repeats combined by MLPerf Training's rule) and
`commbench plot` draws the curves.

    python benchmarks/time_to_accuracy.py [--workers 4] [--repeat 3]
        [--partitions iid,dirichlet:0.1] [--emulate 4x1,2x2 --link 200mbit]
        [--data learnable:noise=4] [--target 0.8] [--out time-to-accuracy]
        [--variants neighbor_allreduce,allreduce] [more sweep flags, e.g. --time-budget 600]

Two strategies also run as a variant, a second sweep into the same results reported as
a row of its own: neighbor_allreduce on the static exponential-2 graph
(--disable-dynamic-topology; its default is the one-peer dynamic schedule) and allreduce
with each worker's own BatchNorm statistics (--no-broadcast-buffers; DDP's default
broadcasts rank 0's). --variants names the strategies whose variant runs ("" for
none). Prints the wall time of the whole study at the end.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

STRATEGIES = "allreduce,neighbor_allreduce,hierarchical_neighbor_allreduce"
VARIANTS = [("neighbor_allreduce", "--disable-dynamic-topology"),
            ("allreduce", "--no-broadcast-buffers")]
TRAINING = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32",
            "--reference-iters", "0", "--eval-every", "10", "--max-epochs", "6"]


def run_to_its_end(command) -> None:
    """subprocess.run, except on Ctrl-C: the terminal sends the sweep the same SIGINT,
    and it ends its job and removes its emulated cluster, which subprocess.run's kill
    of the child 0.25 s later would cut short; so wait for it, then stop."""
    child = subprocess.Popen(command)
    try:
        child.wait()
    except KeyboardInterrupt:
        child.wait()
        raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="4")
    parser.add_argument("--strategies", default=STRATEGIES)
    parser.add_argument("--partitions", default="iid,dirichlet:0.1")
    parser.add_argument("--repeat", default="3")
    parser.add_argument("--data", default="learnable:noise=4,samples=8000")
    parser.add_argument("--target", default="0.8")
    parser.add_argument("--variants", default=",".join(name for name, _ in VARIANTS),
                        help="the strategies whose variant runs too")
    parser.add_argument("--emulate", help="layouts, e.g. 4x1,2x2 (needs root)")
    parser.add_argument("--link", default="200mbit")
    parser.add_argument("--out", default="time-to-accuracy")
    args, extra = parser.parse_known_args()  # anything else goes to every sweep
    started = time.monotonic()
    out = Path(args.out)
    for partition in args.partitions.split(","):
        # on shared memory, machines of 2 workers are simulated for the hierarchical one
        where = ["--emulate", args.emulate, "--link", args.link] if args.emulate else \
            ["--np", args.workers, "--machine-size", "2"]
        sweeps = [["--dist-optimizer", args.strategies]]
        sweeps += [["--dist-optimizer", strategy, flag] for strategy, flag in VARIANTS
                   if strategy in args.variants.split(",")]
        for strategies in sweeps:
            command = [sys.executable, "-m", "commbench", "sweep", *where, *strategies,
                       "--repeat", args.repeat,
                       "--results-dir", str(out / "results" / partition.replace(":", "-")),
                       "--plots-dir", str(out / "charts"), *TRAINING, "--data", args.data,
                       "--partition", partition, "--target-accuracy", args.target, *extra]
            print("$", " ".join(command[1:]), flush=True)
            run_to_its_end(command)
        # every row of the partition together (each sweep reports only its own jobs)
        results = str(out / "results" / partition.replace(":", "-"))
        for command in (["report", results], ["plot", results, "-o", str(out / "charts")]):
            print("$ commbench", " ".join(command), flush=True)
            run_to_its_end([sys.executable, "-m", "commbench", *command])
    print(f"\nwall time of the study: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
