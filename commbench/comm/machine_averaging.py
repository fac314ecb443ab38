"""Hierarchical averaging: the mixer of hierarchical_neighbor_allreduce over flat
parameter buffers, for machines of two or more ranks. One step is
X' = (W_M kron J_L/L) X: allreduce inside each machine, the machine's leader (its
first rank) averages with neighbor machines' leaders along W_M, then broadcasts the
result back inside its machine.

Inside a machine the bytes move through its process group, or through shared memory
(commbench.comm.shared_memory): there the machine's sum is the leader adding its ranks'
slots and the broadcast is every rank reading the leader's, with no copies through
sockets that take the cores the transfer between machines needs.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from commbench.comm.neighbor_exchange import NeighborExchange
from commbench.comm.shared_memory import machine_slots
from commbench.timing import wire
from commbench.launch.groups import machine_groups
from commbench.timing.wire import NOTHING, Sent

# Bytes of one piece of the pipeline per transport between machines. MPI and NCCL get
# whole buffers (None): Open MPI moves a message only while its rank is inside an MPI
# call, so a piece would not travel while the machine sums the next; on GPUs the
# machine's own links are far faster than the network, and one exchange per buffer
# keeps the NCCL communicators' order of work simple.
PIPELINE_BYTES = {"gloo": 4 << 20, "mpi": None, "nccl": None}

SHARED_MEMORY = "shared memory"  # what `inside` names when the machine's ranks share slots


class MachineAveraging:
    """The mixer of one hierarchical step over flat parameter buffers x (machines of
    two or more ranks).

    The machine's sum travels in communication buffers c: x itself when nothing
    reads x meanwhile (ATC in float32), else a copy (AWC: backward still reads x
    while the allreduce runs; with a narrow type, --compression fp16 or bf16: c holds
    that type). Only the leader
    (first rank of a machine) talks to other machines, through a NeighborExchange
    whose nodes are machines (over `transport`); its step counter follows the machine
    schedule.

    With a narrow type, x moves by the change the step makes to what it sent,
    x <- x + (result - sent), rather than being replaced by the narrow result: an
    update smaller than the narrow type's resolution would otherwise be rounded away
    every step.

    Between machines over gloo the step runs in pieces of PIPELINE_BYTES, a pipeline: the
    leaders exchange piece p as soon as the machine's allreduce of it is done, and
    broadcast it back as soon as it is combined, so the link carries the exchange while
    the machine still sums and broadcasts the other pieces (serially, the link would
    idle through both).

    inside=SHARED_MEMORY (several machines, over gloo between them): c is this rank's
    slot of the machine's shared buffers, the leader's slot doubles as the result r,
    and a small broadcast per piece tells the others that r's piece is final. Without
    a narrow type, x itself moves into the slot (`buffers` then names the slots, and the
    plugin moves the parameters there): nothing touches the slots between start() and
    finish(), so backward can read x while nothing is copied. Where a machine cannot
    make its slots, every rank falls back to its process group (`inside` then names
    the group's backend).
    """

    def __init__(self, buffers, schedule, rank: int, machine_size: int, narrow,
                 overlapped: bool, transport: str = "gloo", inside: Optional[str] = None):
        import torch
        import torch.distributed as dist

        self.buffers = list(buffers)
        self.local = machine_size
        machines, machine = schedule.size, rank // machine_size
        self.leader = machine * machine_size
        self.narrow = narrow  # the torch dtype the machine's sums travel in; None: x's own
        self.transport = transport  # between machines
        self.group = machine_groups(machine_size, machines * machine_size)[machine]
        self.several_machines = machines > 1
        dtypes = [narrow or b.dtype for b in self.buffers]
        slots = None
        if inside == SHARED_MEMORY and self.several_machines:
            slots = machine_slots([(b.numel(), d) for b, d in zip(self.buffers, dtypes)],
                                  self.group, self.leader, rank - self.leader, machine_size)
        self.inside = SHARED_MEMORY if slots else dist.get_backend(self.group)
        if slots:
            self.slots = slots
            self.comm = [s[rank - self.leader] for s in slots]
            if narrow is None:  # x lives in this rank's slot: nothing to copy in before a step
                for c, b in zip(self.comm, self.buffers):
                    c.copy_(b)
                self.buffers = list(self.comm)
        elif narrow is not None or overlapped:
            self.comm = [torch.empty_like(b, dtype=d) for b, d in zip(self.buffers, dtypes)]
        else:
            self.comm = self.buffers
        # where every rank takes the step's result from
        self.result = [s[0] for s in slots] if slots else self.comm
        if narrow is not None:
            self.sent = [torch.empty_like(c) for c in self.comm]
        self.pieces = pieces(self.comm, PIPELINE_BYTES[transport] if self.several_machines
                             else None)
        # The leader's exchanges with neighbor machines, one per piece (none elsewhere).
        self.exchanges: List[NeighborExchange] = []
        if rank == self.leader and self.several_machines:
            # With a narrow type the leader combines in full precision and sends narrow
            # copies;
            # otherwise it combines the machine average in c, without copies.
            self.work = [torch.empty_like(b) for b in self.buffers] if narrow is not None \
                else self.comm
            tag = 0
            for k, lo, hi in self.pieces:
                exchange = NeighborExchange([self.work[k][lo:hi]], schedule, machine,
                                            [m * machine_size for m in range(machines)],
                                            narrow=narrow, transport=transport,
                                            first_tag=tag)
                tag += len(exchange.chunks)
                self.exchanges.append(exchange)
        self._works: List = []
        self._final = torch.zeros(len(self.pieces))  # shared memory: one signal per piece

    @property
    def exchange(self) -> Optional[NeighborExchange]:
        """The leader's exchange of the first piece: its peers and weights are every
        piece's (None on other ranks)."""
        return self.exchanges[0] if self.exchanges else None

    def peers(self) -> None:
        """Every rank: the machine's allreduce, then the leaders' exchange, then the
        machine's broadcast, so a late rank anywhere can hold this step back."""
        return None

    def moves_alone(self) -> bool:
        """Only the allreduce inside a lone machine moves before finish(): shared memory
        meets there, and the leaders' exchanges between machines start there."""
        return self.inside != SHARED_MEMORY and not self.several_machines

    def piece_bytes(self) -> int:
        """Bytes of the machine's allreduce (what every rank hands over)."""
        return sum(c.numel() * c.element_size() for c in self.comm)

    def wire(self) -> Sent:
        """What this rank sends in one step: inside its machine each piece's allreduce and
        the leader's broadcast of it (through shared memory only the leader's one-number
        signal per piece; the barriers carry no data), and the leader's exchanges with
        neighbor machines."""
        leader = not self.several_machines or bool(self.exchanges)
        sent = sum((e.wire() for e in self.exchanges), NOTHING)
        for k, lo, hi in self.pieces:
            nbytes = (hi - lo) * self.comm[k].element_size()
            if self.inside == SHARED_MEMORY:
                sent += wire.broadcast(self._final.element_size(), self.local, leader)
                continue
            sent += wire.ring_allreduce(nbytes, self.local)
            if self.several_machines:
                sent += wire.broadcast(nbytes, self.local, leader)
        return sent

    def start(self) -> None:
        import torch.distributed as dist

        self._works = []
        for k, lo, hi in self.pieces:  # each piece's sum starts once it is copied
            c = self.comm[k][lo:hi]
            if self.comm[k] is not self.buffers[k]:
                c.copy_(self.buffers[k][lo:hi])
            if self.narrow is not None:
                self.sent[k][lo:hi].copy_(c)
            if self.inside != SHARED_MEMORY:
                self._works.append(dist.all_reduce(c, group=self.group, async_op=True))

    def finish(self) -> None:
        import torch.distributed as dist

        if self.inside == SHARED_MEMORY:
            self._finish_shared()
            return
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

    def _finish_shared(self) -> None:
        """The step through the machine's shared slots: the leader sums each piece of
        the slots into its own and exchanges it at once, so the link carries piece p
        while it sums the next; each piece is final once combined, and the others copy
        it out as soon as the leader says so."""
        import torch.distributed as dist

        dist.barrier(group=self.group)  # every rank's slot holds its buffers
        signals = []
        if self.exchanges:  # the leader
            for exchange, (k, lo, hi) in zip(self.exchanges, self.pieces):
                total = self.result[k][lo:hi]
                for slot in self.slots[k][1:]:
                    total.add_(slot[lo:hi])
                self._before_exchange(k, lo, hi)
                exchange.start()
            for i, (exchange, (k, lo, hi)) in enumerate(zip(self.exchanges, self.pieces)):
                exchange.finish()
                self._after_exchange(k, lo, hi)
                signals.append(dist.broadcast(self._final[i:i + 1], self.leader,
                                              group=self.group, async_op=True))
                self._take_result(k, lo, hi)
            for signal in signals:
                signal.wait()
        else:
            signals = [dist.broadcast(self._final[i:i + 1], self.leader, group=self.group,
                                      async_op=True) for i in range(len(self.pieces))]
            for signal, piece in zip(signals, self.pieces):
                signal.wait()
                self._take_result(*piece)
        # The leader's slot is the result: it writes the next step's buffers there only
        # once no rank reads this step's.
        dist.barrier(group=self.group)

    def _take_result(self, k: int, lo: int, hi: int) -> None:
        """x <- the result r for one piece (the leader too: a machine's ranks end
        alike), or with a narrow type, x <- x + (r - sent)."""
        r, x = self.result[k][lo:hi], self.buffers[k][lo:hi]
        if self.narrow is not None:
            x.sub_(self.sent[k][lo:hi].sub_(r))
        elif self.result[k] is not self.buffers[k]:
            x.copy_(r)

    def _before_exchange(self, k: int, lo: int, hi: int) -> None:
        """The machine's average of a piece, into what the leader exchanges."""
        if self.narrow is not None:  # average and combine in full precision
            self.work[k][lo:hi].copy_(self.comm[k][lo:hi]).div_(self.local)
        else:
            self.comm[k][lo:hi].div_(self.local)

    def _after_exchange(self, k: int, lo: int, hi: int) -> None:
        """A narrow type: round the combined piece into c, to broadcast."""
        if self.narrow is not None:
            self.comm[k][lo:hi].copy_(self.work[k][lo:hi])


def pieces(buffers, piece_bytes: Optional[int]) -> List[Tuple[int, int, int]]:
    """(buffer index, start, end) of every piece of piece_bytes (None: whole buffers)."""
    found = []
    for k, b in enumerate(buffers):
        step = max(1, piece_bytes // b.element_size()) if piece_bytes else b.numel()
        found += [(k, lo, min(lo + step, b.numel())) for lo in range(0, b.numel(), step)]
    return found
