"""Where the ranks of a job meet to set up torch.distributed, in order: the launcher's
MASTER_ADDR/MASTER_PORT (torchrun, or a user who sets them); under an MPI launcher,
rank 0's address and a free port shared over MPI (mpi4py); under Slurm, the job's first
host and a port derived from the job id (as Lightning does); under horovodrun's gloo
controller, Horovod's own broadcast."""

from __future__ import annotations

import os
import socket
import subprocess
from typing import List, Tuple

from commbench.errors import UsageError
from commbench.launch.detect import LaunchInfo


def rendezvous_address(info: LaunchInfo) -> Tuple[str, int]:
    env = os.environ
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return env["MASTER_ADDR"], int(env["MASTER_PORT"])
    if info.mpi or "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return _rendezvous_over_mpi()
    if info.launcher == "slurm":
        return _slurm_first_host(), 10000 + int(env.get("SLURM_JOB_ID", "0")) % 20000
    if info.launcher == "horovodrun":
        return _rendezvous_over_horovod()
    raise UsageError(f"{info.launcher} started {info.world_size} ranks but gave no "
                     "rendezvous address: set MASTER_ADDR and MASTER_PORT")


def _rendezvous_over_mpi() -> Tuple[str, int]:
    try:
        from mpi4py import MPI
    except ImportError:
        raise UsageError("started by an MPI launcher but mpi4py is not installed: "
                         "pip install 'commbench[mpi]', or set MASTER_ADDR and MASTER_PORT")
    comm = MPI.COMM_WORLD
    hosts = comm.allgather(socket.gethostname())
    address = None
    if comm.rank == 0:
        address = (_address_towards(hosts), _free_port())
    return comm.bcast(address, root=0)


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
