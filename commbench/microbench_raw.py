"""The raw primitives of `commbench microbench`: the same exchange as each op of
commbench.microbench_ops with no commbench code, the reference its ratios are
measured against in the same job.

  torch all_reduce          dist.all_reduce of the tensor (sum), nothing else
  MPI Allreduce             mpi4py, in place (only under an MPI launcher)
  gloo send/recv            batch_isend_irecv of S to every out-neighbor and from
                            every in-neighbor, one message each
  MPI Neighbor_allgather    mpi4py on a distributed-graph communicator per phase of
                            the schedule (only under an MPI launcher)
  gloo composite            (hierarchical) all_reduce inside the machine, leaders'
                            send/recv, broadcast inside the machine
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple


class Primitive(NamedTuple):
    """One raw contender: run() is timed, reset() runs before it, untimed."""

    impl: str
    run: Callable[[], None]
    reset: Callable[[], None]


def _no_reset() -> None:  # the payload is only read
    pass


def _on_mpi_cpu(ctx) -> bool:
    """mpi4py reads and writes the tensors' memory: CPU tensors under an MPI launcher."""
    return bool(ctx.launch.mpi) and ctx.device.type == "cpu"


def allreduce(ctx, data) -> List[Primitive]:
    import torch.distributed as dist

    summed = data.fresh()
    found = [Primitive("torch all_reduce", lambda: dist.all_reduce(summed),
                       data.copy_in(summed))]
    if _on_mpi_cpu(ctx):
        from mpi4py import MPI

        flat = data.fresh()
        view = flat.numpy()  # zero copy: MPI reads and writes the tensor's memory
        comm = MPI.COMM_WORLD
        found.append(Primitive("MPI Allreduce", lambda: comm.Allreduce(MPI.IN_PLACE, view),
                               data.copy_in(flat)))
    return found


def _send_recv(payload, incoming: List[Any], plan) -> None:
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
    """Raw gloo send/recv (and MPI Neighbor_allgather) of the same bytes along the
    same peers as NeighborExchange at each call; plan_at(call) is its Plan."""
    payload = data.fresh()
    incoming: List[Any] = []
    calls = [0]

    def gloo_raw():
        plan = plan_at(calls[0])
        calls[0] += 1
        _send_recv(payload, incoming, plan)

    found = [Primitive("gloo send/recv", gloo_raw, _no_reset)]
    if _on_mpi_cpu(ctx):
        found.append(Primitive("MPI Neighbor_allgather",
                               _mpi_neighbor(ctx.rank, schedule, payload), _no_reset))
    return found


def _mpi_neighbor(rank: int, schedule, payload) -> Callable[[], None]:
    import numpy as np
    from mpi4py import MPI

    send = payload.numpy()
    graphs: Dict[int, Any] = {}
    calls = [0]
    # One graph communicator per phase of the schedule: MPI's neighborhood
    # collectives need the graph up front. Created collectively, so all now.
    for phase in range(schedule.period):
        t = schedule.at(phase)
        sources = list(t.in_neighbors(rank))
        destinations = list(t.out_neighbors(rank))
        comm = MPI.COMM_WORLD.Create_dist_graph_adjacent(sources, destinations,
                                                         reorder=False)
        graphs[phase] = (comm, np.empty((len(sources), send.size), dtype=send.dtype))

    def run():
        comm, receive = graphs[calls[0] % schedule.period]
        calls[0] += 1
        comm.Neighbor_allgather(send, receive)

    return run


def composite(data, exchange, group, leader: int) -> Primitive:
    """Hierarchical averaging from gloo primitives: all_reduce inside the machine
    (group), the leader's send/recv along exchange's plan (exchange is None on the
    other ranks), broadcast from the leader inside the machine."""
    import torch.distributed as dist

    flat = data.fresh()
    incoming: List[Any] = []
    calls = [0]

    def gloo_composite():
        plan = exchange.plan(calls[0]) if exchange is not None else None
        calls[0] += 1
        dist.all_reduce(flat, group=group)
        if plan is not None:
            _send_recv(flat, incoming, plan)
        dist.broadcast(flat, leader, group=group)

    return Primitive("gloo composite", gloo_composite, data.copy_in(flat))
