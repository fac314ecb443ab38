"""Do the periodic strategies run at the speed the hardware allows? On an emulated
cluster of --workers machines x 1 rank at --link (root), `none`, `allreduce` and
`local_sgd` and `diloco` at each H of --periods run as speed jobs in one sweep. Per
periodic job, the allowed step is the compute-only step measured in the same job plus
one meeting's bytes (what a communicating step sent, summary.wire) over H steps and the
link's rate; its img/sec against the allowed img/sec (target: >= 0.90), and its bytes
per step against allreduce's (target: <= 1/(0.8 H)).

    python benchmarks/diagnostics/periodic_speed.py [--link 200mbit] [--periods 4,16,64]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commbench import units

MODEL = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32",
         "--num-warmup-batches", "4"]


def sweep(args, directory: Path) -> None:
    """The jobs, each measuring 3 iterations: of 4 steps for `none` and `allreduce`, of
    H steps (three meetings) for a periodic strategy."""
    jobs = [(["--dist-optimizer", "none,allreduce"], 4)] + [
        (["--dist-optimizer", name, "--average-every", str(h)], h)
        for name in ("local_sgd", "diloco") for h in args.periods]
    for flags, per_iteration in jobs:
        subprocess.run([sys.executable, "-m", "commbench", "sweep",
                        "--emulate", f"{args.workers}x1", "--link", args.link, *flags, *MODEL,
                        "--num-batches-per-iter", str(per_iteration), "--num-iters", "3",
                        "--results-dir", str(directory), "--plots-dir",
                        str(directory / "charts")], check=True)


def summaries(directory: Path):
    """{(strategy, H or None): (summary, batch size)} of the sweep's results."""
    found = {}
    for path in directory.glob("*.json"):
        doc = json.loads(path.read_text())
        every = doc["strategy"].get("average_every")
        found[(doc["strategy"]["name"], every)] = (doc["summary"], doc["config"]["batch_size"])
    return found


def allowed(summary, batch: int, every: int, rate: float) -> float:
    """img/sec per worker the hardware allows: the compute-only step, plus one meeting's
    bytes spread over its H steps at the link's rate."""
    compute = batch / summary["compute_only_img_sec_per_worker"]
    meeting = summary["wire"]["bytes_per_communicating_step"]
    return batch / (compute + meeting / (every * rate))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", default="200mbit")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--periods", type=lambda t: [int(h) for h in t.split(",")],
                        default=[4, 16, 64])
    args = parser.parse_args()
    started = time.monotonic()
    rate = units.rate_bits(args.link, "--link") / 8
    with tempfile.TemporaryDirectory() as scratch:
        sweep(args, Path(scratch))
        found = summaries(Path(scratch))
    ring = found[("allreduce", None)][0]["wire"]["bytes_per_step"]
    print(f"{args.workers} emulated machines x 1 at {args.link}; img/sec per worker")
    print(f"{'strategy':<14}{'H':>4}{'img/sec':>9}{'allowed':>9}{'ratio':>7}"
          f"{'bytes/step vs allreduce':>25}{'bound':>8}")
    missed = 0
    for name in ("local_sgd", "diloco"):
        for every in args.periods:
            summary, batch = found[(name, every)]
            got = summary["img_sec_per_worker"]["mean"]
            ratio = got / allowed(summary, batch, every, rate)
            share = summary["wire"]["bytes_per_step"] / ring
            bound = 1 / (0.8 * every)
            missed += ratio < 0.90 or share > bound
            print(f"{name:<14}{every:>4}{got:>9.1f}{got / ratio:>9.1f}{ratio:>7.2f}"
                  f"{share:>25.4f}{bound:>8.4f}")
    print(f"{missed} row(s) miss a target; {time.monotonic() - started:.0f} s")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
