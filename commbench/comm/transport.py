"""How point-to-point messages move: torch.distributed (gloo, NCCL) or, for CPU
tensors under an MPI launcher, mpi4py on the tensors' own memory (zero copy).
`--cpu-transport` chooses; GPU tensors always go through torch.distributed.

`auto` picks by where the bytes go: MPI when every rank is on one machine (shared
memory), gloo when the ranks span several. Between machines Open MPI's TCP allreduce
leaves much of the link idle where gloo's ring fills it, and its point-to-point messages
move only while the rank is inside an MPI call, so an exchange meant to overlap the
backward pass waits for the step's end, where gloo's own threads move it meanwhile
(docs/measurements.md, "Every strategy at link rate"; docs/cluster.md's network-regime
study). Small messages between machines are the exception: latency binds them, and a
rank polling inside MPI answers sooner than gloo's threads wake, so below
SMALL_MESSAGE_BYTES they go over MPI. Where a machine has more ranks than cores, ranks
that poll take each other's cores: an allreduce, whose rounds each wait for a peer
that is not running, stays on gloo; a point-to-point message small enough that Open MPI
sends it at once (below EAGER_BYTES) still goes over MPI, since only its receiver waits.

A transport posts a list of chunks, each a list of messages, and returns one
handle per chunk that is done when all of that chunk's messages are, so a caller
can use each chunk as soon as it arrived.
"""

from __future__ import annotations

import sys
from typing import Callable, List, NamedTuple, Optional

from commbench.errors import UsageError

SMALL_MESSAGE_BYTES = 256 << 10
# Open MPI's TCP transport sends a message whole, without waiting for the receiver, up
# to its eager limit (btl_tcp_eager_limit: 64 KB, its header included; 1 KB is left for it)
EAGER_BYTES = 63 << 10

MPI_UNAVAILABLE = ("argument --cpu-transport: mpi needs a job started by an MPI launcher "
                   "(mpiexec) that set up mpi4py (installed, and no MASTER_ADDR/MASTER_PORT)")


def mpi_ready() -> bool:
    """Whether mpi4py is already imported and MPI initialised (an MPI launcher's
    rendezvous did it): the MPI transport never starts MPI itself."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def check_cpu_transport(choice: str, launch) -> None:
    """--cpu-transport mpi without an MPI launcher, refused before init (whether mpi4py
    was set up shows only after the rendezvous: choose_transport)."""
    if choice == "mpi" and not launch.mpi:
        raise UsageError(MPI_UNAVAILABLE)


def choose_transport(choice: str, ctx) -> str:
    """The transport of --cpu-transport `choice` in this job: "mpi", or the process
    group's backend ("gloo", "nccl")."""
    if getattr(ctx.device, "type", ctx.device) != "cpu":
        return ctx.backend
    available = ctx.launch.mpi and mpi_ready()
    if choice == "mpi" and not available:
        raise UsageError(MPI_UNAVAILABLE)
    if choice == "auto":
        return "mpi" if available and not between_machines(ctx) else ctx.backend
    return "mpi" if choice == "mpi" else ctx.backend


def between_machines(ctx) -> bool:
    return len(set(ctx.hostnames)) > 1


class SmallMessages(NamedTuple):
    """Messages of fewer than `below` bytes go over `transport`."""

    transport: str
    below: int


def small_messages(choice: str, ctx, point_to_point: bool) -> Optional[SmallMessages]:
    """Where `auto` moves small messages over another transport than choose_transport's
    pick: MPI between machines, below SMALL_MESSAGE_BYTES while every rank has a core of
    its own, else below EAGER_BYTES for point-to-point messages only; None elsewhere
    (every size then goes one way)."""
    if choice != "auto" or getattr(ctx.device, "type", ctx.device) != "cpu":
        return None
    if not (ctx.launch.mpi and mpi_ready() and between_machines(ctx)):
        return None
    if any(workers > cores for _, workers, cores in ctx.machine_load()):
        return SmallMessages("mpi", EAGER_BYTES) if point_to_point else None
    return SmallMessages("mpi", SMALL_MESSAGE_BYTES)


def transport_for(nbytes: int, transport: str, small: Optional[SmallMessages]) -> str:
    """The transport of a message of `nbytes`: small.transport below small.below, when
    there is a size rule, else `transport`."""
    return small.transport if small and nbytes < small.below else transport


def small_message_facts(small: Optional[SmallMessages]) -> dict:
    """What a result records of the size rule (None: every size over `transport`)."""
    return {"small_message_transport": small.transport if small else None,
            "small_message_bytes": small.below if small else None}


def transport_reason(choice: str, transport: str, ctx) -> str:
    """Why a path moves over `transport`, for the run's header and result."""
    if choice != "auto":
        return f"--cpu-transport {choice}"
    if getattr(ctx.device, "type", ctx.device) != "cpu":
        return "GPU tensors"
    if transport == "mpi":
        return "--cpu-transport auto under an MPI launcher"
    if ctx.launch.mpi and mpi_ready():
        return "--cpu-transport auto between machines"
    return "--cpu-transport auto without an MPI launcher"


class Handle(NamedTuple):
    """Completion of one chunk's messages."""

    wait: Callable[[], None]


class TorchTransport:
    """Point-to-point messages through torch.distributed, all posted in one batch."""

    @staticmethod
    def post(chunks: List[list]) -> List[Handle]:
        """chunks[c]: the ("recv" | "send", tensor, peer, tag) messages of chunk c."""
        import torch.distributed as dist

        ops, owner = [], []  # owner[i]: the chunk that op i belongs to
        for c, messages in enumerate(chunks):
            for kind, tensor, peer, tag in messages:
                ops.append(dist.P2POp(dist.irecv if kind == "recv" else dist.isend,
                                      tensor, peer, tag=tag))
                owner.append(c)
        works: List[list] = [[] for _ in chunks]
        for c, work in zip(owner, dist.batch_isend_irecv(ops) if ops else []):
            if work is not None:
                works[c].append(work)
        return [Handle(lambda w=w: [work.wait() for work in w]) for w in works]


class MpiTransport:
    """The same messages through mpi4py on COMM_WORLD (its ranks are the process
    group's under an MPI launcher), reading and writing the tensors' memory."""

    @staticmethod
    def post(chunks: List[list]) -> List[Handle]:
        from mpi4py import MPI

        from commbench.job.failure import mpi_deadline

        def wait_all(requests):
            with mpi_deadline.watch("neighbor exchange (MPI)"):
                MPI.Request.Waitall(requests)

        comm, handles = MPI.COMM_WORLD, []
        for messages in chunks:
            requests = []
            for kind, tensor, peer, tag in messages:
                memory = _bytes_of(tensor)
                post = comm.Irecv if kind == "recv" else comm.Isend
                requests.append(post(memory, peer, tag))
            handles.append(Handle(lambda r=requests: wait_all(r)))
        return handles


def _bytes_of(tensor) -> memoryview:
    """A CPU tensor's memory as bytes, for MPI (numpy has no bfloat16: viewed as int16)."""
    import torch

    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return memoryview(tensor.numpy()).cast("B")


TRANSPORTS = {"mpi": MpiTransport, "gloo": TorchTransport, "nccl": TorchTransport}
