"""Hierarchical averaging: the mixer of hierarchical_neighbor_allreduce over flat
parameter buffers, for machines of two or more ranks. One step is
X' = (W_M kron J_L/L) X: allreduce inside each machine, the machine's leader (its
first rank) averages with neighbor machines' leaders along W_M, then broadcasts the
result back inside its machine.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from commbench.comm.neighbor_exchange import NeighborExchange
from commbench.launch.groups import machine_groups

# Bytes of one piece of the pipeline per transport between machines. MPI and NCCL get
# whole buffers (None): Open MPI moves a message only while its rank is inside an MPI
# call, so a piece would not travel while the machine sums the next; on GPUs the
# machine's own links are far faster than the network, and one exchange per buffer
# keeps the NCCL communicators' order of work simple.
PIPELINE_BYTES = {"gloo": 4 << 20, "mpi": None, "nccl": None}


class MachineAveraging:
    """The mixer of one hierarchical step over flat parameter buffers x (machines of
    two or more ranks).

    The machine's sum travels in communication buffers c: x itself when nothing
    reads x meanwhile (ATC in float32), else a copy (AWC: backward still reads x
    while the allreduce runs; --fp16-allreduce: c holds float16). Only the leader
    (first rank of a machine) talks to other machines, through a NeighborExchange
    whose nodes are machines (over `transport`); its step counter follows the machine
    schedule.

    With --fp16-allreduce, x moves by the change the step makes to what it sent,
    x <- x + (result - sent), rather than being replaced by the float16 result: an
    update smaller than float16's resolution would otherwise be rounded away every step.

    Between machines over gloo the step runs in pieces of PIPELINE_BYTES, a pipeline: the
    leaders exchange piece p as soon as the machine's allreduce of it is done, and
    broadcast it back as soon as it is combined, so the link carries the exchange while
    the machine still sums and broadcasts the other pieces (serially, the link would
    idle through both).
    """

    def __init__(self, buffers, schedule, rank: int, machine_size: int, fp16: bool,
                 overlapped: bool, transport: str = "gloo"):
        import torch

        self.buffers = list(buffers)
        self.local = machine_size
        machines, machine = schedule.size, rank // machine_size
        self.leader = machine * machine_size
        self.fp16 = fp16
        if fp16:
            self.comm = [torch.empty_like(b, dtype=torch.float16) for b in self.buffers]
            self.sent = [torch.empty_like(c) for c in self.comm]
        elif overlapped:
            self.comm = [torch.empty_like(b) for b in self.buffers]
        else:
            self.comm = self.buffers
        self.group = machine_groups(machine_size, machines * machine_size)[machine]
        self.several_machines = machines > 1
        self.pieces = pieces(self.comm, PIPELINE_BYTES[transport] if self.several_machines
                             else None)
        # The leader's exchanges with neighbor machines, one per piece (none elsewhere).
        self.exchanges: List[NeighborExchange] = []
        if rank == self.leader and self.several_machines:
            # With fp16 the leader combines in full precision and sends float16 copies;
            # otherwise it combines the machine average in c, without copies.
            self.work = [torch.empty_like(b) for b in self.buffers] if fp16 else self.comm
            tag = 0
            for k, lo, hi in self.pieces:
                exchange = NeighborExchange([self.work[k][lo:hi]], schedule, machine,
                                            [m * machine_size for m in range(machines)],
                                            fp16=fp16, transport=transport, first_tag=tag)
                tag += len(exchange.chunks)
                self.exchanges.append(exchange)
        self._works: List = []

    @property
    def exchange(self) -> Optional[NeighborExchange]:
        """The leader's exchange of the first piece: its peers and weights are every
        piece's (None on other ranks)."""
        return self.exchanges[0] if self.exchanges else None

    def peers(self) -> None:
        """Every rank: the machine's allreduce, then the leaders' exchange, then the
        machine's broadcast, so a late rank anywhere can hold this step back."""
        return None

    def piece_bytes(self) -> int:
        """Bytes of the machine's allreduce (what every rank hands over)."""
        return sum(c.numel() * c.element_size() for c in self.comm)

    def start(self) -> None:
        import torch.distributed as dist

        self._works = []
        for k, lo, hi in self.pieces:  # each piece's sum starts once it is copied
            c = self.comm[k][lo:hi]
            if self.comm[k] is not self.buffers[k]:
                c.copy_(self.buffers[k][lo:hi])
            if self.fp16:
                self.sent[k][lo:hi].copy_(c)
            self._works.append(dist.all_reduce(c, group=self.group, async_op=True))

    def finish(self) -> None:
        import torch.distributed as dist

        if not self.several_machines:  # every rank holds the sum: average locally
            for work in self._works:
                work.wait()
            self._works = []
            for c in self.comm:
                c.div_(self.local)
            for piece in self.pieces:
                self._take_result(*piece)
            return
        works, self._works = self._works, []
        if self.exchanges:  # the leader: each piece to neighbor machines once summed
            for work, exchange, piece in zip(works, self.exchanges, self.pieces):
                work.wait()
                self._before_exchange(*piece)
                exchange.start()
            works = []
            for exchange, (k, lo, hi) in zip(self.exchanges, self.pieces):
                exchange.finish()
                self._after_exchange(k, lo, hi)
                works.append(dist.broadcast(self.comm[k][lo:hi], self.leader, group=self.group,
                                            async_op=True))
                self._take_result(k, lo, hi)  # final here; the broadcast only reads c
            for work in works:
                work.wait()
            return
        # Non-leaders' c holds the machine sum; the leader's result overwrites it.
        for i, (k, lo, hi) in enumerate(self.pieces):
            works[i].wait()
            works[i] = dist.broadcast(self.comm[k][lo:hi], self.leader, group=self.group,
                                      async_op=True)
        for work, piece in zip(works, self.pieces):
            work.wait()
            self._take_result(*piece)

    def _take_result(self, k: int, lo: int, hi: int) -> None:
        """x <- the result in c for one piece (the leader too: a machine's ranks end
        alike), or with float16, x <- x + (c - sent)."""
        c, x = self.comm[k][lo:hi], self.buffers[k][lo:hi]
        if self.fp16:
            x.sub_(self.sent[k][lo:hi].sub_(c))
        elif self.comm[k] is not self.buffers[k]:
            x.copy_(c)

    def _before_exchange(self, k: int, lo: int, hi: int) -> None:
        """The machine's average of a piece, into what the leader exchanges."""
        if self.fp16:  # average and combine in full precision
            self.work[k][lo:hi].copy_(self.comm[k][lo:hi]).div_(self.local)
        else:
            self.comm[k][lo:hi].div_(self.local)

    def _after_exchange(self, k: int, lo: int, hi: int) -> None:
        """fp16: round the combined piece into c, to broadcast."""
        if self.fp16:
            self.comm[k][lo:hi].copy_(self.work[k][lo:hi])


def pieces(buffers, piece_bytes: Optional[int]) -> List[Tuple[int, int, int]]:
    """(buffer index, start, end) of every piece of piece_bytes (None: whole buffers)."""
    found = []
    for k, b in enumerate(buffers):
        step = max(1, piece_bytes // b.element_size()) if piece_bytes else b.numel()
        found += [(k, lo, min(lo + step, b.numel())) for lo in range(0, b.numel(), step)]
    return found
