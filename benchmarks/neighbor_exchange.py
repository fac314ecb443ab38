"""Microbenchmark: commbench's fused neighbor exchange + combine against the raw
primitives doing the same exchange, side by side in one job.

    mpiexec -n 4 python benchmarks/neighbor_exchange.py [--megabytes 25] [--repetitions 20]

One float32 flat buffer (the size of a model's parameters) on a static topology
(exponential-2 by default). The contenders, interleaved within each repetition so
that load on a shared machine hits all of them alike:

  commbench  NeighborExchange, as neighbor_allreduce runs it: the buffer goes to each
             out-neighbor and comes from each in-neighbor (batch_isend_irecv), then
             x <- W x in place
  commbench (mpi transport)
             the same NeighborExchange over mpi4py Isend/Irecv (--cpu-transport mpi;
             only when started by an MPI launcher)
  1 message  the same, but one message per buffer and neighbor, combined after it all
             arrived (NeighborExchange before issue #3)
  gloo raw   the same batch_isend_irecv of the same bytes, and nothing else
             (transfer only: the bare cost of moving the bytes)
  gloo raw + combine
             the whole operation written plainly without commbench: that
             batch_isend_irecv (one message per neighbor), then
             x <- w_self x + sum_j w_j recv_j with torch mul_/add_ (checked once
             against the dense reference, like commbench)
  combine    x <- W x on buffers already received, no communication: what commbench
             adds to gloo raw when nothing overlaps
  MPI raw    mpi4py Neighbor_allgather on a distributed-graph communicator of the
             same graph (only when started by an MPI launcher)

A repetition's time is the slowest rank's (barrier, then each rank's own clock).
Printed: median and interquartile range per contender, bytes per rank, effective
per-link bandwidth (bytes of one buffer / time: links run concurrently), and the
ratio of commbench to each raw primitive. neighbor_allreduce is transfer + combine,
so its like-for-like reference is "gloo raw + combine" (target: commbench / it
<= 1.15); commbench / gloo raw (transfer only) is the cost over bare transfer.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Dict, List


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=25.0,
                        help="buffer size in MB (10^6 bytes) of float32 (default: 25)")
    parser.add_argument("--repetitions", type=int, default=20,
                        help="timed repetitions per contender (default: 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repetitions (default: 3)")
    parser.add_argument("--chunk-kb", type=int, default=None,
                        help="NeighborExchange message size in KiB (default: its CHUNK_BYTES)")
    parser.add_argument("--topology", default="exponential-2",
                        help="static topology (default: exponential-2)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import numpy as np
    import torch
    import torch.distributed as dist

    from commbench.launch.distributed import init_distributed
    from commbench.launch.environment import detect_launch
    from commbench.optimizers.neighbor_exchange import NeighborExchange, mpi_ready
    from commbench.topology import build_schedule

    launch = detect_launch()
    ctx = init_distributed(launch, no_cuda=True, timeout=300)
    rank, n = ctx.rank, ctx.world_size
    schedule = build_schedule(args.topology, n, dynamic=False)
    topology = schedule.at(0)
    sources, destinations = list(topology.in_neighbors(rank)), list(topology.out_neighbors(rank))
    count = int(args.megabytes * 1e6) // 4

    buffer = torch.empty(count, dtype=torch.float32)
    chunk = {"chunk_bytes": args.chunk_kb * 1024} if args.chunk_kb else {}
    exchange = NeighborExchange([buffer], schedule, rank, **chunk)
    # The pre-#3 behaviour (one message per buffer, combine after the last byte),
    # interleaved with the rest so that the gain of chunking is measured in one job.
    whole = torch.empty(count, dtype=torch.float32)
    unchunked = NeighborExchange([whole], schedule, rank, chunk_bytes=whole.numel() * 4)
    check_exchange(exchange, buffer, topology, rank)
    over_mpi = None
    if launch.mpi and mpi_ready():  # the MPI rendezvous of init_distributed set it up
        over_mpi = NeighborExchange([torch.empty(count, dtype=torch.float32)], schedule, rank,
                                    transport="mpi", **chunk)
        check_exchange(over_mpi, over_mpi.buffers[0], topology, rank)

    payload = torch.rand(count, dtype=torch.float32)
    received = [torch.empty_like(payload) for _ in sources]

    def gloo_raw():
        ops = [dist.P2POp(dist.irecv, r, s) for r, s in zip(received, sources)]
        ops += [dist.P2POp(dist.isend, payload, d) for d in destinations]
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()

    plan = exchange.plan(0)

    def combine_only():  # the arithmetic NeighborExchange adds to gloo raw, alone
        buffer.mul_(plan.self_weight)
        for r, (_, weight) in zip(received, plan.sources):
            buffer.add_(r, alpha=weight)

    gloo_raw_combine = PlainExchange(torch.empty(count, dtype=torch.float32), topology, rank)
    check_exchange(gloo_raw_combine, gloo_raw_combine.x, topology, rank)

    contenders: Dict[str, Callable[[], None]] = {"commbench": exchange, "1 message": unchunked,
                                                 "gloo raw": gloo_raw,
                                                 "gloo raw + combine": gloo_raw_combine,
                                                 "combine": combine_only}
    if over_mpi is not None:
        contenders["commbench (mpi transport)"] = over_mpi
    if launch.mpi:
        contenders["MPI raw"] = mpi_neighbor_allgather(payload.numpy(), sources, destinations)

    times = {name: [] for name in contenders}
    for repetition in range(args.warmup + args.repetitions):
        for name, run in contenders.items():
            dist.barrier()
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
            if repetition >= args.warmup:
                times[name].append(elapsed)

    slowest = {}
    for name, mine in times.items():
        t = torch.tensor(mine, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        slowest[name] = t.numpy()
    if rank == 0:
        report(args, n, count * 4, len(sources), len(destinations), slowest, np)
    dist.barrier()


def check_exchange(exchange, buffer, topology, rank: int) -> None:
    """One step on rank-valued buffers must give row `rank` of W @ (0, 1, ..., n-1)."""
    buffer.fill_(float(rank))
    exchange()
    import numpy as np

    want = float(topology.weights[rank] @ np.arange(topology.size))
    got = float(buffer[0]), float(buffer[-1])
    if not all(abs(g - want) < 1e-5 for g in got):
        raise SystemExit(f"rank {rank}: the exchange gave {got}, the dense reference {want}")


class PlainExchange:
    """Neighbor averaging as a user writes it with torch.distributed alone: the whole
    buffer x to every out-neighbor and from every in-neighbor in one batch_isend_irecv
    (one message each), then x <- w_self x + sum_j w_j recv_j in place."""

    def __init__(self, x, topology, rank: int):
        import torch

        self.x = x
        self.self_weight = topology.self_weight(rank)
        self.sources = list(topology.in_neighbors(rank).items())
        self.destinations = list(topology.out_neighbors(rank))
        self.received = [torch.empty_like(x) for _ in self.sources]

    def __call__(self) -> None:
        import torch.distributed as dist

        ops = [dist.P2POp(dist.irecv, r, j) for r, (j, _) in zip(self.received, self.sources)]
        ops += [dist.P2POp(dist.isend, self.x, d) for d in self.destinations]
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        self.x.mul_(self.self_weight)
        for r, (_, w) in zip(self.received, self.sources):
            self.x.add_(r, alpha=w)


def mpi_neighbor_allgather(send, sources: List[int], destinations: List[int]):
    """The same exchange as one MPI neighborhood collective (zero-copy on numpy views)."""
    import numpy as np
    from mpi4py import MPI

    graph = MPI.COMM_WORLD.Create_dist_graph_adjacent(sources, destinations, reorder=False)
    receive = np.empty((len(sources), send.size), dtype=send.dtype)

    def run():
        graph.Neighbor_allgather(send, receive)

    return run


def report(args, n: int, nbytes: int, in_degree: int, out_degree: int, slowest, np) -> None:
    print(f"Neighbor exchange on {n} ranks, static {args.topology}: "
          f"{nbytes / 1e6:.1f} MB float32 per buffer; each rank sends {out_degree} and "
          f"receives {in_degree} buffers ({out_degree * nbytes / 1e6:.1f} MB out, "
          f"{in_degree * nbytes / 1e6:.1f} MB in)")
    print(f"Median of {args.repetitions} repetitions (slowest rank of each), "
          f"after {args.warmup} untimed:")
    medians = {}
    for name, t in slowest.items():
        medians[name] = float(np.median(t))
        q1, q3 = np.percentile(t, [25, 75])
        print(f"  {name:<25} {medians[name] * 1e3:8.2f} ms  (IQR {q1 * 1e3:.2f} .. "
              f"{q3 * 1e3:.2f} ms)  per-link {nbytes / medians[name] / 1e9:6.2f} GB/s")
    labels = {  # neighbor_allreduce is transfer + combine: compare like with like first
        "gloo raw + combine": "same whole operation, plain torch; target <= 1.15",
        "gloo raw": "transfer only",
        "MPI raw": "transfer only",
    }
    for ours in ("commbench", "commbench (mpi transport)"):
        for raw, label in labels.items():
            if ours in medians and raw in medians:
                ratio = medians[ours] / medians[raw]
                print(f"  {ours} / {raw:<18} {ratio:5.2f}   ({label})")


if __name__ == "__main__":
    main()
