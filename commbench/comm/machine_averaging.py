"""Hierarchical averaging: the mixer of hierarchical_neighbor_allreduce over flat
parameter buffers, for machines of two or more ranks. One step is
X' = (W_M kron J_L/L) X: allreduce inside each machine, the machine's leader (its
first rank) averages with neighbor machines' leaders along W_M, then broadcasts the
result back inside its machine.
"""

from __future__ import annotations

from typing import List, Optional

from commbench.comm.neighbor_exchange import NeighborExchange
from commbench.launch.groups import machine_groups


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
        self.exchange: Optional[NeighborExchange] = None
        if rank == self.leader and self.several_machines:
            # With fp16 the leader combines in full precision and sends float16 copies;
            # otherwise it combines the machine average in c, without copies.
            self.work = [torch.empty_like(b) for b in self.buffers] if fp16 else self.comm
            self.exchange = NeighborExchange(self.work, schedule, machine,
                                             [m * machine_size for m in range(machines)],
                                             fp16=fp16, transport=transport)
        self._works: List = []

    def peers(self) -> None:
        """Every rank: the machine's allreduce, then the leaders' exchange, then the
        machine's broadcast, so a late rank anywhere can hold this step back."""
        return None

    def piece_bytes(self) -> int:
        """Bytes of the machine's allreduce (what every rank hands over)."""
        return sum(c.numel() * c.element_size() for c in self.comm)

    def start(self) -> None:
        import torch.distributed as dist

        for c, x in zip(self.comm, self.buffers):
            if c is not x:
                c.copy_(x)
        if self.fp16:
            for sent, c in zip(self.sent, self.comm):
                sent.copy_(c)
        self._works = [dist.all_reduce(c, group=self.group, async_op=True) for c in self.comm]

    def finish(self) -> None:
        import torch.distributed as dist

        for work in self._works:
            work.wait()
        self._works = []
        if not self.several_machines:  # every rank holds the sum: average locally
            for c in self.comm:
                c.div_(self.local)
            self._take_result()
            return
        if self.exchange is not None:
            self._combine_with_other_machines()
        # Non-leaders' c holds the machine sum; the leader's result overwrites it.
        for work in [dist.broadcast(c, self.leader, group=self.group, async_op=True)
                     for c in self.comm]:
            work.wait()
        self._take_result()

    def _take_result(self) -> None:
        """x <- the result in c (the leader too: a machine's ranks end alike), or with
        float16, x <- x + (c - sent)."""
        for i, (c, x) in enumerate(zip(self.comm, self.buffers)):
            if self.fp16:
                x.sub_(self.sent[i].sub_(c))
            elif c is not x:
                x.copy_(c)

    def _combine_with_other_machines(self) -> None:
        if not self.fp16:
            for c in self.comm:
                c.div_(self.local)
            self.exchange()
        else:  # fp16: average and combine in full precision, round into c to broadcast
            for c, w in zip(self.comm, self.work):
                w.copy_(c).div_(self.local)
            self.exchange()
            for c, w in zip(self.comm, self.work):
                c.copy_(w)
