"""Where the ranks of a job meet to set up torch.distributed, in order: the launcher's
MASTER_ADDR/MASTER_PORT (torchrun, or a user who sets them); under an MPI launcher,
rank 0's address and a free port shared over MPI (mpi4py); under Slurm, the job's first
host and a port derived from the job id (as Lightning does); under horovodrun's gloo
controller, Horovod's own broadcast.

Every wait here for the other ranks ends the job after --timeout (commbench.job.failure's
start-up line), naming the ranks that did not arrive where this rank can know them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from commbench.errors import UsageError
from commbench.job.failure import name_ranks, patience_for_rank_0, startup_failed, startup_wait
from commbench.launch.detect import LaunchInfo

# Message tags of the roll call over MPI; nothing else talks on COMM_WORLD this early.
ARRIVED, ANSWER = 38_001, 38_002
OVER_MPI = "the rendezvous over MPI"


@dataclass(frozen=True)
class Meeting:
    """Where torch.distributed's ranks meet, and every rank's machine where the way
    there learnt them (rank 0 only: for naming a rank that does not arrive)."""

    addr: str
    port: int
    hosts: Tuple[str, ...] = ()


def rendezvous_address(info: LaunchInfo, timeout: float) -> Meeting:
    env = os.environ
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return Meeting(env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    if info.mpi or "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return _rendezvous_over_mpi(timeout)
    if info.launcher == "slurm":
        return Meeting(_slurm_first_host(), 10000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
    if info.launcher == "horovodrun":
        with startup_wait(timeout, f"no answer at Horovod's rendezvous for {timeout:g} s "
                          "(--timeout)"):
            return Meeting(*_rendezvous_over_horovod())
    raise UsageError(f"{info.launcher} started {info.world_size} ranks but gave no "
                     "rendezvous address: set MASTER_ADDR and MASTER_PORT")


def _rendezvous_over_mpi(timeout: float) -> Meeting:
    """A roll call rather than allgather and bcast: every rank reports its machine to
    rank 0, which answers each once all have reported. Rank 0 sees who is missing and
    names them at the deadline; a blocking collective would only hang."""
    MPI = _start_mpi(timeout)
    comm = MPI.COMM_WORLD
    if comm.rank != 0:
        sent = comm.isend(socket.gethostname(), dest=0, tag=ARRIVED)
        patience = patience_for_rank_0(timeout)
        answered = poll_until(time.monotonic() + patience,
                              lambda: comm.iprobe(source=0, tag=ANSWER))
        if not answered:
            startup_failed(f"rank 0 did not answer at {OVER_MPI} within {patience:g} s "
                           "(--timeout, and time for rank 0 to report)")
        addr, port = comm.recv(source=0, tag=ANSWER)
        sent.wait()
        return Meeting(addr, port)
    hosts: List[Optional[str]] = [socket.gethostname()] + [None] * (comm.size - 1)

    def all_arrived() -> bool:
        while comm.iprobe(tag=ARRIVED):
            status = MPI.Status()
            hosts[status.source] = comm.recv(tag=ARRIVED, status=status)
        return None not in hosts

    if not poll_until(time.monotonic() + timeout, all_arrived):
        missing = [r for r, host in enumerate(hosts) if host is None]
        startup_failed(f"{name_ranks(missing)} of {comm.size} did not arrive at {OVER_MPI} "
                       f"within {timeout:g} s (--timeout)")
    meeting = Meeting(_address_towards(hosts), _free_port(), tuple(hosts))
    answers = [comm.isend((meeting.addr, meeting.port), dest=r, tag=ANSWER)
               for r in range(1, comm.size)]
    _wait_for_sends(MPI, answers, hosts, timeout)
    return meeting


def _start_mpi(timeout: float):
    """mpi4py's MPI, initialised under the start-up deadline.

    mpi4py initialises MPI on import, holding the GIL, so no thread of this process could
    act while MPI_Init waits for a rank that never comes. Called through ctypes, which
    releases the GIL, MPI_Init_thread leaves the deadline's timer free to end the job.
    What mpi4py does after its own initialisation is done here: errors raise exceptions,
    and MPI is finalised at exit."""
    if "mpi4py.MPI" not in sys.modules:
        try:
            import mpi4py
        except ImportError:
            raise UsageError("started by an MPI launcher but mpi4py is not installed: pip "
                             "install 'commbench[mpi]', or set MASTER_ADDR and MASTER_PORT")
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = True
    from mpi4py import MPI

    if not MPI.Is_initialized():
        with startup_wait(timeout, f"no answer from the other ranks during MPI "
                          f"initialisation for {timeout:g} s (--timeout); MPI cannot say "
                          "which rank is missing: each waiting rank prints this line, "
                          "the missing ones do not", mpi_usable=False):
            _init_thread_releasing_the_gil(MPI)
        for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):
            comm.Set_errhandler(MPI.ERRORS_RETURN)
    return MPI


def _init_thread_releasing_the_gil(MPI) -> None:
    import ctypes

    try:
        # The extension's handle finds MPI_Init_thread in the MPI library it links.
        init_thread = ctypes.CDLL(MPI.__file__).MPI_Init_thread
    except (OSError, AttributeError):
        MPI.Init_thread(MPI.THREAD_MULTIPLE)  # no deadline, as before, but MPI works
        return
    provided = ctypes.c_int()
    code = init_thread(None, None, MPI.THREAD_MULTIPLE, ctypes.byref(provided))
    if code != 0:
        raise RuntimeError(f"MPI_Init_thread failed (error code {code})")


def poll_until(deadline: float, done: Callable[[], bool]) -> bool:
    """Whether done() came true before the deadline. Polled rather than blocked on: MPI
    waits have no timeout. The first polls come quickly, so a start-up where every
    rank is there is not slowed."""
    pause = 0.0005
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.02)
    return True


def _wait_for_sends(MPI, requests, hosts: List[Optional[str]], timeout: float) -> None:
    """Rank 0's answers, delivered: a rank that stopped after it reported cannot take a
    large one."""
    if not poll_until(time.monotonic() + timeout, lambda: MPI.Request.Testall(requests)):
        late = [r + 1 for r, request in enumerate(requests) if not request.Test()]
        startup_failed(f"{name_ranks(late, hosts)} did not take rank 0's answer at {OVER_MPI} "
                       f"within {timeout:g} s (--timeout)")


def _rendezvous_over_horovod() -> Tuple[str, int]:
    try:
        import horovod.torch as hvd
    except ImportError:
        raise UsageError("started by horovodrun's gloo controller but horovod is not "
                         "importable: set MASTER_ADDR and MASTER_PORT")
    hvd.init()
    hosts = hvd.allgather_object(socket.gethostname(), name="commbench.hosts")
    address = (_address_towards(hosts), _free_port()) if hvd.rank() == 0 else None
    # An explicit name: Horovod matches collectives by name and would otherwise name
    # this one after the object's type, a tuple on rank 0 and None elsewhere (a hang).
    return hvd.broadcast_object(address, root_rank=0, name="commbench.rendezvous")


def _address_towards(hosts: List[str]) -> str:
    """Rank 0's address as the other ranks can reach it."""
    me = hosts[0]
    others = [h for h in hosts if h != me]
    if not others:
        return "127.0.0.1"
    # The local address of the route to a peer is one that peers can reach,
    # unlike gethostbyname(hostname), which is often 127.0.1.1.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(others[0]), 9))
        return probe.getsockname()[0]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _slurm_first_host() -> str:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True,
                             capture_output=True, text=True, timeout=30).stdout
        return out.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        raise UsageError("cannot find the Slurm job's first host with `scontrol show "
                         "hostnames`: set MASTER_ADDR and MASTER_PORT")


def bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr
