"""The timed loop of `commbench microbench`, the same for every op: one op at one size, its
contenders (commbench's call, then the raw primitives) interleaved within each call
so that load on a shared machine hits all of them alike, each output checked, and
the rows of every rank's samples (schema in commbench.microbench.results; metrics
defined in commbench.result.metrics). On an emulated cluster each machine's interface
counts what left it during each call (commbench.microbench.link).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from commbench.microbench import link
from commbench.microbench.ops.base import Data


def bench(op_cls, plugin_cls, ctx, config, count: int, args) -> List[Dict[str, Any]]:
    """Every contender of one op (a commbench.microbench.ops class) at one size of `count`
    elements; its rows (on rank 0; [] elsewhere)."""
    from commbench.result.environment import emulated_network

    op = op_cls(plugin_cls, ctx, config, Data(ctx, count))
    timed = contenders(op, raw=not args.no_raw, check=bool(args.check))
    network = emulated_network()
    nic = link.counter(network, ctx.launch.local_rank)
    measured = measure(timed, ctx, args.warmup_iters, args.iters, nic,
                       settle=link.refill_seconds(network), rate=link.own_rate(network))
    return rows(op, timed, measured)


class Contender:
    """One implementation: reset() before each call (untimed), run() timed, then
    check(call) -> True when the output is right (commbench rows, with -c 1);
    traffic(call) -> (bytes sent, bytes received) by this rank, of the float32 payload;
    wire_fraction: what it actually sends per byte of that (--compression)."""

    def __init__(self, impl: str, run: Callable[[], None], reset: Callable[[], None],
                 traffic: Callable[[int], Tuple[float, float]],
                 check: Optional[Callable[[int], bool]] = None, wire_fraction: float = 1.0):
        self.impl, self.run, self.reset, self.check = impl, run, reset, check
        self.traffic, self.wire_fraction = traffic, wire_fraction
        self.seconds: List[float] = []
        self.wrong = 0
        self.sent: List[float] = []
        self.received: List[float] = []
        self.nic_bytes: List[int] = []  # what left this machine per call (first rank only)


def contenders(op, raw: bool, check: bool) -> List[Contender]:
    """The op's commbench call first (the ratios' numerator), then its raw primitives,
    all moving the same bytes (the op's closed form)."""
    def right(call: int) -> bool:
        return op.data.is_right(op.buffer, op.reference(call), op.tolerance)

    found = [Contender("commbench", op.run, op.data.copy_in(op.buffer), op.traffic,
                       right if check else None, op.wire_fraction)]
    if raw:
        found += [Contender(p.impl, p.run, p.reset, op.traffic, None, p.wire_fraction)
                  for p in op.raw()]
    return found


def measure(timed: List[Contender], ctx, warmup: int, iters: int,
            nic: Optional[link.NicCounter] = None, settle: float = 0.0,
            rate: Optional[float] = None) -> List[Any]:
    """Interleaved calls of every contender; every rank's samples (on every rank).
    The clock stops after a device sync: a GPU collective returns when it is queued.
    `nic`: this machine's interface counter, read before each call (untimed); `rate`:
    its link's rate (bits/s), recorded beside what it counted.
    `settle`: seconds to pause before each call (untimed; an emulated link's refill)."""
    import torch.distributed as dist

    from commbench.job.speed_loop import barrier, device_sync

    sync = device_sync(ctx.device)
    before, last = 0, None
    for call in range(warmup + iters):
        for c in timed:
            c.reset()
            sync()  # the reset's copies are not the call's work
            if settle:
                time.sleep(settle)
            barrier()
            if nic:
                # What left since the previous call began is that call's: its tail may
                # leave after it returned, but before this barrier's messages.
                counted = nic.read()
                if last is not None:
                    last.nic_bytes.append(counted - before)
                before, last = counted, (c if call >= warmup else None)
            start = time.perf_counter()
            c.run()
            sync()
            elapsed = time.perf_counter() - start
            if c.check is not None and not c.check(call):
                c.wrong += 1
            if call >= warmup:
                c.seconds.append(elapsed)
                sent, received = c.traffic(call)
                c.sent.append(sent * c.wire_fraction)
                c.received.append(received * c.wire_fraction)
    barrier()  # the last call's tail has left by now
    if nic and last is not None:
        last.nic_bytes.append(nic.read() - before)
    mine = [(c.seconds, c.wrong, c.sent, c.received, c.nic_bytes, rate) for c in timed]
    everyone: List[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    return everyone


def rows(op, timed: List[Contender], everyone: List[Any]) -> List[Dict[str, Any]]:
    """One row per contender from every rank's samples (rank 0; [] elsewhere)."""
    import numpy as np

    from commbench.result import metrics

    if op.rank != 0:
        return []
    found = []
    for i, c in enumerate(timed):
        seconds = [rank[i][0] for rank in everyone]
        stats = metrics.call_time_stats(seconds)
        algbw = metrics.algbw(op.S, stats["mean"])
        summary: Dict[str, Any] = {"time": stats, "algbw": algbw, **op.bandwidths(algbw)}
        if c.wire_fraction != 1.0:  # the same figures in the bytes that went on the wire
            summary["wire_fraction"] = c.wire_fraction
            summary.update({f"{k}_sent": v * c.wire_fraction for k, v in list(summary.items())
                            if k.endswith("bw")})
        machines = [(sum(rank[i][4]) / sum(rank[i][0]), rank[i][5]) for rank in everyone
                    if rank[i][4]]  # each machine's bytes out over its first rank's time
        if machines:
            summary["nic_bw"] = float(np.mean([bw for bw, _ in machines]))
            summary["link_fraction"] = link.fraction_of_rate(machines)
        found.append({
            "op": op.name, "impl": c.impl, "commbench": c.impl == "commbench",
            "transport": op.transport() if c.impl == "commbench" else None,
            "bytes": op.S, "count": op.data.count, "seconds": seconds,
            "bytes_sent": float(np.mean([rank[i][2] for rank in everyone])),
            "bytes_received": float(np.mean([rank[i][3] for rank in everyone])),
            "bytes_sent_per_rank": [float(np.mean(rank[i][2])) for rank in everyone],
            "wrong": sum(rank[i][1] for rank in everyone) if c.check is not None else None,
            "summary": summary,
        })
    ours = found[0]
    ours["summary"]["ratio_to_raw"] = {
        r["impl"]: metrics.paired_ratio(ours["seconds"], r["seconds"]) for r in found[1:]}
    return found
