"""One neighbor-averaging step on flat buffers: x_i <- W[i,i] x_i + sum_j W[i,j] x_j.

Every buffer goes to each out-neighbor and comes from each in-neighbor as a single
point-to-point message (torch.distributed `batch_isend_irecv`, on gloo and NCCL
alike). `start()` posts the messages and returns at once, so the caller can compute
while they travel (AWC overlaps them with the backward pass); `finish()` waits,
combines in place and advances the schedule by one step.

Shared by neighbor_allreduce (nodes are ranks), hierarchical_neighbor_allreduce
(nodes are machines, represented by one rank each) and benchmarks/neighbor_exchange.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from commbench.topology import Schedule


class Plan(NamedTuple):
    """What one node does at one step, in process-group ranks."""

    self_weight: float
    sources: Tuple[Tuple[int, float], ...]  # (rank, weight) of each in-neighbor
    destinations: Tuple[int, ...]  # rank of each out-neighbor


class NeighborExchange:
    """Neighbor averaging of `buffers` along `schedule`, one step per start/finish."""

    def __init__(self, buffers: Sequence["torch.Tensor"], schedule: "Schedule", node: int,
                 ranks: Optional[Sequence[int]] = None, fp16: bool = False):
        """node: this process's index in the schedule's graph. ranks[k]: the process-
        group rank that speaks for node k (default: node k is rank k). fp16: send
        float16 copies; the combination is still computed in the buffers' dtype."""
        self.buffers = list(buffers)
        self.schedule = schedule
        self.node = node
        self.ranks = list(ranks) if ranks is not None else list(range(schedule.size))
        self.fp16 = fp16
        self.step = 0  # index into the schedule; advanced by finish()
        self._plans: Dict[int, Plan] = {}
        self._received: Dict[Tuple[int, int], "torch.Tensor"] = {}  # (source slot, buffer)
        self._half: List["torch.Tensor"] = []
        self._pending: Optional[Tuple[Plan, list]] = None

    def plan(self, step: int) -> Plan:
        """Weights and peers at `step`; cached per phase of the (periodic) schedule."""
        phase = step % self.schedule.period
        if phase not in self._plans:
            topology = self.schedule.at(phase)
            self._plans[phase] = Plan(
                topology.self_weight(self.node),
                tuple((self.ranks[j], w) for j, w in topology.in_neighbors(self.node).items()),
                tuple(self.ranks[i] for i in topology.out_neighbors(self.node)),
            )
        return self._plans[phase]

    def start(self) -> None:
        """Post this step's sends and receives; the buffers must not change until finish()."""
        import torch.distributed as dist

        if self._pending is not None:
            raise RuntimeError("NeighborExchange.start() called twice without finish()")
        plan = self.plan(self.step)
        outgoing = self._outgoing() if plan.destinations else self.buffers
        ops = []
        # One tag per buffer: gloo matches messages by (peer, tag), so the buffers of
        # one step can never be confused with each other. NCCL ignores tags.
        for slot, (source, _) in enumerate(plan.sources):
            for k in range(len(self.buffers)):
                ops.append(dist.P2POp(dist.irecv, self._receive_buffer(slot, k), source, tag=k))
        for destination in plan.destinations:
            for k, sent in enumerate(outgoing):
                ops.append(dist.P2POp(dist.isend, sent, destination, tag=k))
        works = dist.batch_isend_irecv(ops) if ops else []
        self._pending = (plan, [w for w in works if w is not None])

    def finish(self) -> None:
        """Wait for this step's messages and combine them into the buffers in place."""
        if self._pending is None:
            raise RuntimeError("NeighborExchange.finish() called without start()")
        plan, works = self._pending
        self._pending = None
        for work in works:
            work.wait()
        if plan.sources or plan.self_weight != 1.0:
            for k, buffer in enumerate(self.buffers):
                buffer.mul_(plan.self_weight)
                for slot, (_, weight) in enumerate(plan.sources):
                    # float16 messages are promoted to the buffer's dtype by add_.
                    buffer.add_(self._received[slot, k], alpha=weight)
        self.step += 1

    def __call__(self) -> None:
        self.start()
        self.finish()

    def _outgoing(self) -> List["torch.Tensor"]:
        """The buffers themselves (zero copy), or float16 copies with --fp16-allreduce."""
        import torch

        if not self.fp16:
            return self.buffers
        if not self._half:
            self._half = [torch.empty_like(b, dtype=torch.float16) for b in self.buffers]
        for half, buffer in zip(self._half, self.buffers):
            half.copy_(buffer)
        return self._half

    def _receive_buffer(self, slot: int, k: int) -> "torch.Tensor":
        # Allocated on first use and kept: dynamic schedules reuse the same slots.
        import torch

        key = (slot, k)
        if key not in self._received:
            dtype = torch.float16 if self.fp16 else self.buffers[k].dtype
            self._received[key] = torch.empty_like(self.buffers[k], dtype=dtype)
        return self._received[key]
