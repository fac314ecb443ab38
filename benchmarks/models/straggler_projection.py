"""Does `simulate`'s straggler model hold where every rank has a core of its own? The
winner-map check (winner_map_projection.py) runs 4 ranks on this box's 2 cores, where a
straggler's injected delay is a sleep that hands its core to the others, so the box
hides part of what a straggler costs on machines with a device per rank. Here the
workers are as many as the cores (OMP_NUM_THREADS=1, as `sweep` sets it): speed runs on
shared memory without a straggler to calibrate on, then the same strategies on emulated
machines of one worker at --link, with no straggler and with --slow; each setting
projected from the shared-memory runs alone and set against its measurement.

    python benchmarks/models/straggler_projection.py [--workers 2] [--link 1gbit]
        [--slow 1:2] [--out straggler-projection]

Prints per strategy and straggler setting the measured img/sec, the projected, the
error, and what the straggler cost (measured and projected), each run's interval
beside it. Runs are speed runs (sweep defaults), about 15 minutes; needs root (emulated
machines).
"""

import argparse
import subprocess
import sys
from pathlib import Path

WORKLOAD = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32"]
STRATEGIES = "allreduce,neighbor_allreduce,local_sgd,diloco"


def commbench(*args) -> None:
    print("$ commbench", " ".join(map(str, args)), flush=True)
    subprocess.run([sys.executable, "-m", "commbench", *map(str, args)], check=True,
                   stdout=subprocess.DEVNULL)


def measured(directory: Path):
    """{(stragglers, strategy label): (mean total img/sec, its interval)} of the runs."""
    from commbench.analysis import reading
    from commbench.result.store import load_results
    from commbench.simulate.calibrate import strategy_of

    found = {}
    runs, notes = reading.usable(load_results([directory])[0])
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    for doc in (r.doc for r in runs):
        total = doc["summary"]["total_img_sec"]
        slow = reading.stragglers_of(doc["config"]) or "none"
        found[(slow, strategy_of(doc).label())] = (total["mean"], total.get("ci95"))
    return found


def projected(directory: Path):
    """{strategy label: projected img/sec} of the one projection file in directory."""
    from commbench.result.store import load_results
    from commbench.simulate import projection_file

    files, _ = projection_file.usable(load_results([directory])[0])
    return {row["strategy"]: row["img_sec"] for f in files for row in f.doc["rows"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2,
                        help="as many as the box has cores (default: 2)")
    parser.add_argument("--link", default="1gbit")
    parser.add_argument("--slow", default="1:2", help="the straggler (default: 1:2)")
    parser.add_argument("--out", type=Path, default=Path("straggler-projection"))
    args = parser.parse_args()
    n, out = args.workers, args.out
    commbench("sweep", "--np", n, "--dist-optimizer", STRATEGIES, *WORKLOAD,
              "--results-dir", out / "calibration", "--plots-dir", out / "charts")
    commbench("sweep", "--emulate", f"{n}x1", "--link", args.link, "--dist-optimizer",
              STRATEGIES, "--slow-ranks", "none", "--slow-ranks", args.slow, *WORKLOAD,
              "--results-dir", out / "measured", "--plots-dir", out / "charts")
    runs = measured(out / "measured")
    projections = {}
    for slow in ("none", args.slow):
        where = out / "projected" / slow.replace(":", "x")
        commbench("simulate", out / "calibration", "--np", n, "--link", args.link,
                  "--gpus-per-machine", 1, "--compute-from", "each", "--slow-ranks", slow,
                  "--dist-optimizer", STRATEGIES, "-o", where)
        projections[slow] = projected(where)
    print(f"\n{n} workers, a core each, emulated {n}x1 at {args.link}; projected from "
          "shared-memory runs without a straggler")
    print(f"{'strategy':<46} {'stragglers':<10} {'measured':>16} {'projected':>9} {'error':>7}")
    for (slow, label), (mean, ci) in sorted(runs.items(), key=lambda kv: kv[0][::-1]):
        guess = projections.get(slow, {}).get(label)
        shown = f"{mean:7.1f} ± {ci:5.1f}" if ci is not None else f"{mean:7.1f}"
        error = f"{100 * (guess / mean - 1):+6.1f}%" if guess else "   n/a"
        print(f"{label[:46]:<46} {slow:<10} {shown:>16} {guess or float('nan'):9.1f} {error}")
    print(f"\nwhat the straggler ({args.slow}) cost: img/sec lost, measured and projected")
    for label in sorted({label for _, label in runs}):
        plain, slowed = runs.get(("none", label)), runs.get((args.slow, label))
        guess = [projections[s].get(label) for s in ("none", args.slow)]
        if plain and slowed and all(guess):
            print(f"  {label[:46]:<46} measured {100 * (1 - slowed[0] / plain[0]):5.1f}%  "
                  f"projected {100 * (1 - guess[1] / guess[0]):5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
