"""How steady is this machine? A fixed training workload — the quick preset's model
(squeezenet1_1 at 32 px, batch 16, one thread per process, synthetic data) — on every
core at once for --seconds, nothing else changing. Prints, for windows of 1 s to 60 s,
how much the machine's own throughput differs between windows (coefficient of
variation, min..max): no measurement of that length can be steadier than this on this
machine, whatever is measured. Then the spread a sweep row may have for two sweeps of
--rows rows to agree within 10% on every row (9 out of 10 times), and the shortest
window that has it.

    python benchmarks/diagnostics/machine_drift.py [--seconds 240] [--processes CORES] [--rows 9]
"""

import argparse
import multiprocessing
import os
import statistics
import time
from statistics import NormalDist

WINDOWS = (1, 2, 5, 10, 20, 30, 60)


def work(seconds: float, start_at: float, queue) -> None:
    import torch
    import torch.nn.functional as F
    import torchvision

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.squeezenet1_1(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data, target = torch.randn(16, 3, 32, 32), torch.randint(10, (16,))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    while time.time() < start_at:  # warm up until every process is ready
        step()
    done = []
    while time.time() < start_at + seconds:
        step()
        done.append(time.time())
    queue.put(done)


def spread(finished, start: float, seconds: float, window: float):
    """Images per second of all processes together in each whole window."""
    counts = [0] * int(seconds // window)
    for t in finished:
        k = int((t - start) // window)
        if 0 <= k < len(counts):
            counts[k] += 16
    return [c / window for c in counts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    parser.add_argument("--rows", type=int, default=9)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    start = time.time() + 20  # imports and warm-up first
    workers = [context.Process(target=work, args=(args.seconds, start, queue))
               for _ in range(args.processes)]
    for w in workers:
        w.start()
    finished = sorted(t for _ in workers for t in queue.get())
    for w in workers:
        w.join()
    # A row's spread c allows two sweeps within 10% on all rows when both of a row's
    # measurements err independently: |log ratio| ~ c*sqrt(2)*|Z| <= log(1.1), per row
    # with probability 1 - 0.1/rows.
    z = NormalDist().inv_cdf(1 - 0.1 / (2 * args.rows))
    allowed = 0.0953 / (z * 2 ** 0.5)
    print(f"{args.processes} process(es), {args.seconds:.0f} s, "
          f"{len(finished) * 16 / args.seconds:.1f} img/s in all")
    print(f"{'window':>8} {'windows':>8} {'cv':>7} {'min..max img/s':>18}")
    enough = None
    for window in WINDOWS:
        rates = spread(finished, start, args.seconds, window)
        if len(rates) < 3:
            continue
        cv = statistics.pstdev(rates) / statistics.mean(rates)
        if enough is None and cv <= allowed:
            enough = window
        print(f"{window:>7}s {len(rates):>8} {cv:>6.1%} {min(rates):>8.1f}..{max(rates):.1f}")
    print(f"two sweeps of {args.rows} rows agree within 10% on every row (9 in 10 times) "
          f"when a row's spread is <= {allowed:.1%}: "
          + (f"windows of {enough} s have it" if enough else
             "no window measured here has it; the machine drifts more than that over "
             "every length measured"))


if __name__ == "__main__":
    main()
