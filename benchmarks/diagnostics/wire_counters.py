"""Do the recorded bytes on the wire tell the truth? On an emulated cluster of
--machines machines x 1 rank (every byte a rank sends leaves its machine), each
strategy runs twice, measuring --short and --long iterations; the bytes the machines'
interfaces sent (their counters, read before and after each job) differ between the two
by what the extra measured steps sent, which the result's summary.wire says too. Prints
both per strategy and their ratio (target: within 5%). Needs root.

    python benchmarks/diagnostics/wire_counters.py [--link 1gbit] [--machines 3] [--only S,...]

The difference of two jobs cancels what every job sends once (start-up, the first
broadcast, warm-up steps, the compute-only reference, the gathering of results). For a
decentralized strategy commbench itself measures the consensus distance after every
iteration, an allreduce of the parameters that is no strategy's: its ring's bytes are
taken off the counters. What remains besides the steps' data is TCP/IP's headers and
the receivers' acknowledgements, which the interface counts and the strategy does not
hand its transport.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from timeline_network import mpirun

from commbench.timing import wire
from commbench.cluster import namespaces

STRATEGIES = {
    "allreduce": [],
    "gradient_allreduce": [],
    "neighbor_allreduce": [],
    "neighbor_allreduce (static ring)": ["--topology", "ring", "--disable-dynamic-topology"],
    # machines of one rank: the machines' exchange alone (inside a machine nothing leaves it)
    "hierarchical_neighbor_allreduce": [],
    "local_sgd": ["--average-every", "2"],
    "diloco": ["--average-every", "2"],
    "diloco (bf16)": ["--average-every", "2", "--outer-dtype", "bf16"],
    "horovod": [],  # where Horovod is installed (make engines)
    "horovod (fp16)": ["--fp16-allreduce"],
}
MODEL = ["--model", "resnet18", "--image-size", "32", "--batch-size", "16",
         "--num-warmup-batches", "2", "--num-batches-per-iter", "2", "--reference-iters", "0"]


def consensus_bytes(doc) -> int:
    """What measuring the consensus distance sent in a job: per iteration, a ring
    allreduce of the parameters (float32) on every rank, and one of two float64s."""
    if not doc["strategy"]["decentralized"]:
        return 0
    import torchvision

    model = torchvision.models.resnet18()
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    ranks, iterations = len(doc["samples"]["sent_bytes"]), doc["config"]["num_iters"]
    per_rank = wire.ring_allreduce(parameters, ranks) + wire.ring_allreduce(16, ranks)
    return iterations * ranks * per_rank.nbytes


def job(cluster, strategy: str, flags, iters: int, scratch: Path):
    """(bytes the interfaces sent, less the consensus measurement's, and bytes the
    result says the ranks sent over their measured steps) of one job."""
    out = scratch / f"{strategy.split()[0]}-{iters}-{time.monotonic_ns()}"
    before = namespaces.sent_bytes(cluster)
    mpirun(cluster, [f"--dist-optimizer={strategy.split()[0]}", *MODEL, *flags,
                     "--num-iters", str(iters), "--results-dir", str(out)])
    counted = namespaces.sent_bytes(cluster) - before
    (found,) = out.glob("*.json")
    doc = json.loads(found.read_text())
    return (counted - consensus_bytes(doc),
            sum(sum(rank) for rank in doc["samples"]["sent_bytes"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", default="1gbit")
    parser.add_argument("--machines", type=int, default=3)
    parser.add_argument("--short", type=int, default=1, help="iterations of the short job")
    parser.add_argument("--long", type=int, default=3, help="iterations of the long job")
    parser.add_argument("--only", type=lambda text: text.split(","), default=list(STRATEGIES),
                        metavar="S,...", help="these of the strategies (default: all)")
    args = parser.parse_args()
    unknown = set(args.only) - set(STRATEGIES)
    if unknown:
        parser.error(f"--only: no such strategy here: {', '.join(sorted(unknown))}")
    started = time.monotonic()
    name = f"w{os.getpid() % 10**5}"
    cluster = namespaces.up(name, args.machines, 1, args.link)
    print(f"{args.machines} machines x 1 rank, {args.link} links; bytes of the "
          f"{2 * (args.long - args.short)} extra measured steps of a {args.long}-iteration "
          f"job over a {args.short}-iteration one")
    print(f"{'strategy':<34}{'recorded MB':>12}{'counters MB':>13}{'ratio':>8}")
    worst = 0.0
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for strategy in args.only:
                flags = STRATEGIES[strategy]
                short = job(cluster, strategy, flags, args.short, Path(scratch))
                long = job(cluster, strategy, flags, args.long, Path(scratch))
                counted, recorded = long[0] - short[0], long[1] - short[1]
                ratio = counted / recorded if recorded else float("nan")
                worst = max(worst, abs(ratio - 1))
                print(f"{strategy:<34}{recorded / 1e6:>12.1f}{counted / 1e6:>13.1f}"
                      f"{ratio:>8.3f}", flush=True)
    finally:
        namespaces.down(name)
    print(f"worst |counters / recorded - 1|: {100 * worst:.1f}% (target: within 5%); "
          f"{time.monotonic() - started:.0f} s")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
