"""Where does compression pay, at speed? On an emulated cluster of --workers machines x 1
rank at --link (root), `allreduce` plain, fp16, bf16 and PowerSGD at each rank of
--ranks, and `neighbor_allreduce` plain and bf16, run as speed jobs (one sweep each).
Per job: img/sec per worker and against the same strategy's plain run, bytes per step
and their share of the plain run's, and the codec's part of the step. Targets (issue
41): powersgd:4 sends <= 1/10 of plain allreduce's bytes per step and runs >= 2x its
img/sec; bf16 sends half and runs >= 1.5x.

    python benchmarks/diagnostics/compression_speed.py [--link 200mbit] [--ranks 1,4]
        [--keep DIR]

--keep DIR keeps the jobs' result files there (for `commbench simulate` to be checked on
them); by default they go with a scratch directory.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32",
         "--num-warmup-batches", "4", "--num-batches-per-iter", "4", "--num-iters", "3"]
# (strategy, compression): the targets' rows, (bytes share at most, speed-up at least).
# bf16's "half": DDP still broadcasts BatchNorm's buffers in float32 before every
# forward pass, a few hundredths of a percent of the bytes.
TARGETS = {("allreduce", "powersgd:4"): (0.1, 2.0), ("allreduce", "bf16"): (0.501, 1.5)}


def jobs(ranks):
    yield "allreduce", "none"
    for kind in ("fp16", "bf16", *(f"powersgd:{r}" for r in ranks)):
        yield "allreduce", kind
    yield "neighbor_allreduce", "none"
    yield "neighbor_allreduce", "bf16"


def sweep(args, directory: Path) -> None:
    for strategy, kind in jobs(args.ranks):
        subprocess.run([sys.executable, "-m", "commbench", "sweep",
                        "--emulate", f"{args.workers}x1", "--link", args.link,
                        "--dist-optimizer", strategy, "--compression", kind, *MODEL,
                        "--results-dir", str(directory), "--plots-dir",
                        str(directory / "charts")], check=True)


def summaries(directory: Path):
    """{(strategy, compression): summary} of the sweep's results."""
    found = {}
    for path in directory.glob("*.json"):
        doc = json.loads(path.read_text())
        strategy = doc["strategy"]
        found[(strategy["name"], strategy.get("compression", "none"))] = doc["summary"]
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", default="200mbit")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ranks", type=lambda t: [int(r) for r in t.split(",")],
                        default=[1, 4])
    parser.add_argument("--keep", metavar="DIR", help="keep the result files in DIR")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(args.keep or scratch)
        sweep(args, directory)
        found = summaries(directory)
    print(f"{args.workers} emulated machines x 1 at {args.link}; resnet18, 32 px, batch 32")
    print(f"{'strategy':<20}{'compression':<13}{'img/sec':>9}{'x plain':>9}"
          f"{'bytes/step':>12}{'share':>8}{'codec ms':>10}{'step ms':>9}  target")
    missed = 0
    for strategy, kind in jobs(args.ranks):
        summary, plain = found[(strategy, kind)], found[(strategy, "none")]
        speed = summary["img_sec_per_worker"]["mean"]
        gain = speed / plain["img_sec_per_worker"]["mean"]
        share = summary["wire"]["bytes_per_step"] / plain["wire"]["bytes_per_step"]
        split = summary["step_split"]
        target = TARGETS.get((strategy, kind))
        verdict = ""
        if target:
            met = share <= target[0] and gain >= target[1]
            missed += not met
            verdict = (f"{'met' if met else 'MISSED'} (share <= {target[0]:g}, "
                       f">= {target[1]:g}x)")
        print(f"{strategy:<20}{kind:<13}{speed:>9.1f}{gain:>9.2f}"
              f"{summary['wire']['bytes_per_step'] / 2 ** 20:>10.2f}Mi{share:>8.4f}"
              f"{1e3 * split.get('codec', {}).get('mean', 0.0):>10.1f}"
              f"{1e3 * split['step']['mean']:>9.1f}  {verdict}")
    print(f"{missed} target row(s) missed; {time.monotonic() - started:.0f} s")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
