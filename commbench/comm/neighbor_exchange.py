"""The neighbor-averaging engine: one step x_i <- W[i,i] x_i + sum_j W[i,j] x_j on
flat buffers, along a topology schedule.

Every buffer goes to each out-neighbor and comes from each in-neighbor, cut into
chunks of `chunk_bytes`, one message and one tag per chunk, through a transport
(commbench.comm.transport). `start()` posts all messages and returns at once, so the
caller can compute while they travel (AWC overlaps them with the backward pass);
`finish()` combines chunk by chunk, each as soon as its own messages are done, and
advances the schedule by one step.

Why chunks: (a) the combine of chunk c runs while chunks c+1.. are still in flight,
and (b) a chunk of x and of each received buffer stays in cache across the w_self
and w_j passes, so memory sees about one read of each operand and one write of x
instead of 2 + 3 x in-degree full passes. Chunk c of x is written only after its
sends completed (a buffer being sent must not change) and its receives arrived.

Used by neighbor_allreduce (nodes are ranks), hierarchical_neighbor_allreduce (nodes
are machines, represented by one rank each) and `commbench microbench`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Sequence, Tuple

from commbench.timing import spans, wire
from commbench.comm.transport import TRANSPORTS
from commbench.timing.wire import Sent

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from commbench.topology import Schedule

# Message size per transport: MPI pays a rendezvous per message, which each wait
# between combines exposes, so it gets fewer, larger ones. NCCL gets whole buffers (None):
# batch_isend_irecv returns one Work for the whole batch there, so chunks would not be
# combined one by one anyway, and large batches of P2P ops are reported to hang NCCL.
CHUNK_BYTES = {"gloo": 1 << 20, "nccl": None, "mpi": 4 << 20}


class Plan(NamedTuple):
    """What one node does at one step, in process-group ranks."""

    self_weight: float
    sources: Tuple[Tuple[int, float], ...]  # (rank, weight) of each in-neighbor
    destinations: Tuple[int, ...]  # rank of each out-neighbor


class NeighborExchange:
    """Neighbor averaging of `buffers` along `schedule`, one step per start/finish."""

    def __init__(self, buffers: Sequence["torch.Tensor"], schedule: "Schedule", node: int,
                 ranks: Optional[Sequence[int]] = None, narrow: Optional["torch.dtype"] = None,
                 chunk_bytes: Optional[int] = None, transport: str = "gloo",
                 first_tag: int = 0):
        """node: this process's index in the schedule's graph. ranks[k]: the process-
        group rank that speaks for node k (default: node k is rank k). narrow: send
        copies in this dtype (float16, bfloat16); the combination is still computed in
        the buffers' dtype.
        chunk_bytes: size of one message (every rank must pass the same; default:
        CHUNK_BYTES of the transport; None there: one message per buffer). transport:
        "mpi", or "gloo"/"nccl" for torch.distributed (see
        commbench.comm.transport.choose_transport). first_tag: the tag of the first
        chunk, so that several exchanges between the same ranks can be in flight at once."""
        self.buffers = list(buffers)
        self.schedule = schedule
        self.node = node
        self.ranks = list(ranks) if ranks is not None else list(range(schedule.size))
        self.narrow = narrow
        self.transport, self.transport_name = TRANSPORTS[transport], transport
        self.step = 0  # index into the schedule; advanced by finish()
        # (buffer index, start, end) of every chunk; its position is its message tag,
        # so buffers and chunks of one step can never be confused (gloo matches
        # messages by (peer, tag), as MPI does; NCCL ignores tags and keeps order).
        self.chunks: List[Tuple[int, int, int]] = []
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES[transport]
        self.first_tag = first_tag
        for k, b in enumerate(self.buffers):
            per_chunk = max(1, self.chunk_bytes // b.element_size() if self.chunk_bytes
                            else b.numel())
            self.chunks += [(k, s, min(s + per_chunk, b.numel()))
                            for s in range(0, b.numel(), per_chunk)]
        self._plans: Dict[int, Plan] = {}
        self._received: Dict[Tuple[int, int], "torch.Tensor"] = {}  # (source slot, buffer)
        self._narrow_copies: List["torch.Tensor"] = []
        self._pending: Optional[Tuple[Plan, List[list]]] = None

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

    def peers(self) -> List[int]:
        """The ranks this step receives from (what finish() waits for)."""
        return [source for source, _ in self.plan(self.step).sources]

    def piece_bytes(self) -> int:
        """Bytes this step sends: the parameters to each out-neighbor (in the narrow type
        where there is one)."""
        return self.wire().nbytes

    def moves_alone(self) -> bool:
        """MPI's point-to-point messages move only inside MPI's calls: in finish()."""
        return self.transport_name != "mpi"

    def wire(self) -> Sent:
        """This step's sends: each chunk once to each out-neighbor."""
        per_copy = sum(b.numel() * (2 if self.narrow is not None else b.element_size())
                       for b in self.buffers)
        return wire.to_each(per_copy, len(self.plan(self.step).destinations),
                            len(self.chunks))

    def start(self) -> None:
        """Post this step's sends and receives; the buffers must not change until finish()."""
        if self._pending is not None:
            raise RuntimeError("NeighborExchange.start() called twice without finish()")
        plan = self.plan(self.step)
        outgoing = self._outgoing() if plan.destinations else self.buffers
        # Chunk-major order: chunk 0 goes out to every peer first, so it is also the
        # first to be complete and combined.
        chunks = []
        for tag, (k, lo, hi) in enumerate(self.chunks, self.first_tag):
            chunks.append(
                [("recv", self._receive_buffer(slot, k)[lo:hi], source, tag)
                 for slot, (source, _) in enumerate(plan.sources)]
                + [("send", outgoing[k][lo:hi], destination, tag)
                   for destination in plan.destinations])
        self._pending = (plan, self.transport.post(chunks))

    def finish(self) -> None:
        """Combine each chunk into the buffers in place as soon as its messages are done."""
        if self._pending is None:
            raise RuntimeError("NeighborExchange.finish() called without start()")
        plan, handles = self._pending
        self._pending = None
        combine = bool(plan.sources) or plan.self_weight != 1.0
        for (k, lo, hi), handle in zip(self.chunks, handles):
            handle.wait()  # this chunk's receives arrived and its sends left x
            if combine:
                x = self.buffers[k][lo:hi]
                x.mul_(plan.self_weight)
                for slot, (_, weight) in enumerate(plan.sources):
                    # narrow messages are promoted to the buffer's dtype by add_.
                    x.add_(self._received[slot, k][lo:hi], alpha=weight)
        self.step += 1

    def __call__(self) -> None:
        self.start()
        self.finish()

    def _outgoing(self) -> List["torch.Tensor"]:
        """The buffers themselves (zero copy), or copies in the narrow type (codec time)."""
        import torch

        if self.narrow is None:
            return self.buffers
        if not self._narrow_copies:
            self._narrow_copies = [torch.empty_like(b, dtype=self.narrow) for b in self.buffers]
        started = spans.now()
        for copy, buffer in zip(self._narrow_copies, self.buffers):
            copy.copy_(buffer)
        spans.record("codec", started, spans.now())
        return self._narrow_copies

    def _receive_buffer(self, slot: int, k: int) -> "torch.Tensor":
        # Allocated on first use and kept: dynamic schedules reuse the same slots.
        import torch

        key = (slot, k)
        if key not in self._received:
            dtype = self.narrow or self.buffers[k].dtype
            self._received[key] = torch.empty_like(self.buffers[k], dtype=dtype)
        return self._received[key]
