"""microbench op `neighbor_allreduce`: NeighborExchange.start()/finish() on the flat
buffer the plugin fuses a model into (built by the plugin's own wrap(), schedule from
--topology), and its raw rows, the same exchange with no commbench code:

  gloo send/recv            batch_isend_irecv of S to every out-neighbor and from
                            every in-neighbor, one message each ("nccl send/recv"
                            on GPUs)
  MPI Neighbor_allgather    mpi4py on a distributed-graph communicator per phase of
                            the schedule (only under an MPI launcher)
  ... + combine             either transfer, then the weighted combine
                            x <- w_self x + sum_j w_j recv_j with plain torch ops,
                            weights and peers read from the schedule: the whole
                            operation as a user would write it without commbench.
                            The transfer-only rows are bare bytes moved; neighbor_
                            allreduce also computes the weighted sum, so its ratio
                            to a "+ combine" row is commbench's own overhead.
  commbench, 1 message      NeighborExchange with one message per buffer and peer
                            (no chunks), over the plugin's transport: what
                            chunking buys
  combine only              the weighted combine on buffers already received, no
                            communication: what the combine costs when nothing
                            overlaps it

The output of "+ combine" rows and of "commbench, 1 message" is checked untimed, in
reset() before the next call; a wrong result raises (the job fails).
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple

from commbench.microbench.ops.base import MixingOp, Primitive, no_reset, on_mpi_cpu


class NeighborAllreduce(MixingOp):
    name = "neighbor_allreduce"

    def traffic(self, call: int) -> Tuple[float, float]:
        plan = self.mixer.plan(call)
        return len(plan.destinations) * self.S, len(plan.sources) * self.S

    def reference(self, call: int) -> Sequence[float]:
        return self.schedule.at(call).weights[self.rank]

    def raw(self) -> List[Primitive]:
        return neighbor(self.ctx, self.data, self.mixer.plan, self.schedule) + [
            _one_message(self.ctx.rank, self.data, self.schedule,
                         self.plugin.transport_for([self.data.pristine])),
            _combine_only(self.ctx.rank, self.data, self.schedule)]


def send_recv(payload, incoming: List[Any], plan) -> None:
    """S from every in-neighbor into incoming, S to every out-neighbor, one message each."""
    import torch
    import torch.distributed as dist

    while len(incoming) < len(plan.sources):
        incoming.append(torch.empty_like(payload))
    ops = [dist.P2POp(dist.irecv, r, s) for r, (s, _) in zip(incoming, plan.sources)]
    ops += [dist.P2POp(dist.isend, payload, d) for d in plan.destinations]
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()


def neighbor(ctx, data, plan_at, schedule) -> List[Primitive]:
    """Raw torch.distributed send/recv (and MPI Neighbor_allgather) of the same bytes along the
    same peers as NeighborExchange at each call (plan_at(call) is its Plan), each
    transfer-only and followed by the weighted combine (the whole operation)."""
    payload = data.fresh()
    incoming: List[Any] = []
    calls = [0]

    def torch_raw():
        plan = plan_at(calls[0])
        calls[0] += 1
        send_recv(payload, incoming, plan)

    found = [Primitive(f"{ctx.backend} send/recv", torch_raw, no_reset),
             _torch_combine(ctx, data, schedule)]
    if on_mpi_cpu(ctx):
        found.append(Primitive("MPI Neighbor_allgather",
                               _mpi_neighbor(ctx.rank, schedule, payload)[0], no_reset))
        found.append(_mpi_combine(ctx.rank, data, schedule))
    return found


def _combine(x, self_weight: float, received) -> None:
    """x <- w_self x + sum_j w_j recv_j, in place, plain torch: received is a list of
    (tensor, weight)."""
    x.mul_(self_weight)
    for r, w in received:
        x.add_(r, alpha=w)


class _Phases:
    """Peers and weights of this rank at each phase of the schedule, read once (as a
    user would hold on to their topology), and the call counter."""

    def __init__(self, rank: int, schedule):
        self.period, self.calls = schedule.period, 0
        self.topologies = [schedule.at(p) for p in range(schedule.period)]
        self.sources = [list(t.in_neighbors(rank).items()) for t in self.topologies]
        self.destinations = [list(t.out_neighbors(rank)) for t in self.topologies]
        self.self_weight = [t.self_weight(rank) for t in self.topologies]
        self.rows = [t.weights[rank] for t in self.topologies]

    def next(self) -> int:
        phase = self.calls % self.period
        self.calls += 1
        return phase


def _checked_reset(impl: str, rank: int, data, x, phases: _Phases) -> Callable[[], None]:
    """reset() of a "+ combine" row: first check the previous call's output against
    the dense reference (W_t X)_r (untimed, like commbench's #wrong check), then put
    X_r back. The harness keeps #wrong for commbench rows only, so a raw row that
    is wrong fails the job instead of printing a meaningless ratio."""
    copy_in = data.copy_in(x)

    def reset():
        if phases.calls:
            row = phases.rows[(phases.calls - 1) % phases.period]
            if not data.is_right(x, row):
                raise RuntimeError(f"rank {rank}: raw {impl!r} gave a wrong result at "
                                   f"call {phases.calls - 1}")
        copy_in()

    return reset


def _torch_combine(ctx, data, schedule) -> Primitive:
    """batch_isend_irecv of the whole buffer, one message per neighbor, then combine."""
    import torch
    import torch.distributed as dist

    rank = ctx.rank
    x = data.fresh()
    phases = _Phases(rank, schedule)
    most = max(len(s) for s in phases.sources)
    incoming = [torch.empty_like(x) for _ in range(most)]

    def run():
        phase = phases.next()
        sources = phases.sources[phase]
        ops = [dist.P2POp(dist.irecv, r, j) for r, (j, _) in zip(incoming, sources)]
        ops += [dist.P2POp(dist.isend, x, d) for d in phases.destinations[phase]]
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        _combine(x, phases.self_weight[phase], [(r, w) for r, (_, w) in zip(incoming, sources)])

    impl = f"{ctx.backend} send/recv + combine"
    return Primitive(impl, run, _checked_reset(impl, rank, data, x, phases))


def _mpi_combine(rank: int, data, schedule) -> Primitive:
    """Neighbor_allgather of the whole buffer, then combine from its receive blocks
    (block i comes from sources[i], the order the graph was created with)."""
    import torch

    x = data.fresh()
    phases = _Phases(rank, schedule)
    gather, receives = _mpi_neighbor(rank, schedule, x)
    blocks = [[torch.from_numpy(block) for block in receive] for receive in receives]

    def run():
        phase = phases.next()
        gather()
        _combine(x, phases.self_weight[phase],
                 [(r, w) for r, (_, w) in zip(blocks[phase], phases.sources[phase])])

    impl = "MPI Neighbor_allgather + combine"
    return Primitive(impl, run, _checked_reset(impl, rank, data, x, phases))


def _mpi_neighbor(rank: int, schedule, payload) -> Tuple[Callable[[], None], List[Any]]:
    """Neighbor_allgather of payload, one phase per call; also the receive arrays of
    every phase (rows in the order of that phase's in_neighbors)."""
    import numpy as np
    from mpi4py import MPI

    send = payload.numpy()  # zero copy: MPI reads the tensor's memory
    graphs: List[Any] = []
    calls = [0]
    # One graph communicator per phase of the schedule: MPI's neighborhood
    # collectives need the graph up front. Created collectively, so all now.
    for phase in range(schedule.period):
        t = schedule.at(phase)
        sources = list(t.in_neighbors(rank))
        destinations = list(t.out_neighbors(rank))
        comm = MPI.COMM_WORLD.Create_dist_graph_adjacent(sources, destinations,
                                                         reorder=False)
        graphs.append((comm, np.empty((len(sources), send.size), dtype=send.dtype)))

    def run():
        comm, receive = graphs[calls[0] % schedule.period]
        calls[0] += 1
        comm.Neighbor_allgather(send, receive)

    return run, [receive for _, receive in graphs]


def _one_message(rank: int, data, schedule, transport: str) -> Primitive:
    """commbench's NeighborExchange with the whole buffer as one message per peer."""
    from commbench.comm.neighbor_exchange import NeighborExchange

    x = data.fresh()
    phases = _Phases(rank, schedule)
    exchange = NeighborExchange([x], schedule, rank, chunk_bytes=max(data.nbytes, 4),
                                transport=transport)

    def run():
        phases.next()
        exchange()

    impl = "commbench, 1 message"
    return Primitive(impl, run, _checked_reset(impl, rank, data, x, phases))


def _combine_only(rank: int, data, schedule) -> Primitive:
    """x <- w_self x + sum_j w_j r_j on buffers that arrived already."""
    x = data.fresh()
    phases = _Phases(rank, schedule)
    received = [data.fresh() for _ in range(max(len(s) for s in phases.sources))]

    def run():
        phase = phases.next()
        sources = phases.sources[phase]
        _combine(x, phases.self_weight[phase], [(r, w) for r, (_, w) in zip(received, sources)])

    return Primitive("combine only", run, data.copy_in(x))
