"""Clock alignment: each rank's clock offset to rank 0's, measured over
torch.distributed after the measured steps, so that rank 0 can put every rank's spans
on its own clock (the step split, the timeline)."""

from __future__ import annotations

from typing import List, NamedTuple, Tuple

from commbench.timing.spans import now


def clock_offsets(ctx, rounds: int = 8) -> Tuple[List[float], List[float]]:
    """Each rank's clock offset to rank 0's (add it to put a time on rank 0's clock) and
    its uncertainty (half the best round trip), by ping-pong with rank 0 (Cristian's
    method), one rank at a time. Every rank gets both lists."""
    import torch
    import torch.distributed as dist

    offsets, errors = [0.0] * ctx.world_size, [0.0] * ctx.world_size
    stamp = torch.zeros(1, dtype=torch.float64, device=ctx.device)
    for peer in range(1, ctx.world_size):
        best = None
        for _ in range(rounds):
            if ctx.rank == 0:
                sent = now()
                dist.send(stamp, peer)
                dist.recv(stamp, peer)
                back = now()
                if best is None or back - sent < best.round_trip:
                    best = Round(back - sent, (sent + back) / 2 - float(stamp.item()))
            elif ctx.rank == peer:
                dist.recv(stamp, 0)
                stamp.fill_(now())
                dist.send(stamp, 0)
        if ctx.rank == 0:
            errors[peer], offsets[peer] = best.round_trip / 2, best.offset
    shared = torch.tensor(offsets + errors, dtype=torch.float64, device=ctx.device)
    dist.broadcast(shared, 0)
    values = shared.tolist()
    return values[:ctx.world_size], values[ctx.world_size:]


class Round(NamedTuple):
    """One ping-pong with a peer: its round trip, and the peer's offset it implies."""

    round_trip: float
    offset: float
