"""microbench op `hierarchical_neighbor_allreduce`: the plugin's MachineAveraging
(AWC, its default), and its raw row, "gloo composite": all_reduce inside the machine,
the leaders' send/recv, broadcast inside the machine. Machines of one rank are plain
neighbor averaging, measured against neighbor_allreduce's raw rows.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from commbench.result import metrics
from commbench.comm.machine_averaging import SHARED_MEMORY
from commbench.microbench.ops.base import Data, MixingOp, Primitive
from commbench.microbench.ops.neighbor_allreduce import neighbor, send_recv


class HierarchicalNeighborAllreduce(MixingOp):
    name = "hierarchical_neighbor_allreduce"

    def __init__(self, plugin_cls, ctx, config, data: Data):
        super().__init__(plugin_cls, ctx, config, data)
        self.L = ctx.machine_size
        self.machine, self.leader = self.rank // self.L, self.rank // self.L * self.L
        # The leader's exchange with neighbor machines (None on other ranks); machines
        # of one rank: the plugin is plain neighbor averaging.
        self.exchange = getattr(self.mixer, "exchange", None) if self.L > 1 else self.mixer

    def transport(self) -> Optional[str]:
        """Between machines, and inside them when that is not their process group."""
        between = super().transport()
        inside = getattr(self.mixer, "inside", None)
        return f"{between}; shared memory inside" if inside == SHARED_MEMORY else between

    def traffic(self, call: int) -> Tuple[float, float]:
        """Nominal bytes: ring allreduce inside the machine, the leader's exchange
        with neighbor machines, a flat broadcast from the leader."""
        S, L, t = self.S, self.L, self.schedule.at(call)
        inside = metrics.ring_allreduce_bytes(S, L) if L > 1 else 0.0
        sent, received = inside, inside
        if self.rank == self.leader:
            sent += len(t.out_neighbors(self.machine)) * S + (L - 1) * S
            received += len(t.in_neighbors(self.machine)) * S
        else:
            received += S
        return sent, received

    def reference(self, call: int) -> Any:
        import numpy as np

        # The row of W_M kron J_L/L
        return np.repeat(self.schedule.at(call).weights[self.machine], self.L) / self.L

    def raw(self) -> List[Primitive]:
        if self.L == 1:
            return neighbor(self.ctx, self.data, self.exchange.plan, self.schedule)
        return [composite(self.ctx.backend, self.data, self.exchange, self.mixer.group,
                          self.leader)]


def composite(backend: str, data, exchange, group, leader: int) -> Primitive:
    """Hierarchical averaging from torch.distributed primitives: all_reduce inside the machine
    (group), the leader's send/recv along exchange's plan (exchange is None on the
    other ranks), broadcast from the leader inside the machine."""
    import torch.distributed as dist

    flat = data.fresh()
    incoming: List[Any] = []
    calls = [0]

    def torch_composite():
        plan = exchange.plan(calls[0]) if exchange is not None else None
        calls[0] += 1
        dist.all_reduce(flat, group=group)
        if plan is not None:
            send_recv(flat, incoming, plan)
        dist.broadcast(flat, leader, group=group)

    return Primitive(f"{backend} composite", torch_composite, data.copy_in(flat))
