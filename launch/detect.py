"""Who am I? Rank, world size, local rank, local size and node index, read from
whichever launcher started this process.

Each launcher exports its own variables; the first launcher whose variables are
all present wins, in an order chosen so that a launcher nested inside another
one's allocation is seen first (mpirun inside a Slurm job exports both OMPI_* and
SLURM_*; horovodrun --mpi exports both HOROVOD_* and OMPI_*).
Values a launcher does not export stay None and are filled in later from the
hostnames of all ranks (see `launch.distributed`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple, Union

from commbench.errors import UsageError

# Launchers that start ranks as MPI processes: MPI can carry the rendezvous.
MPI_LAUNCHERS = ("openmpi", "mpich")
# Where an MPI library finds its peers by itself: under an MPI launcher, under srun
# (through PMI), or alone (MPI's singleton start).
MPI_WORLDS = MPI_LAUNCHERS + ("slurm", "single")


@dataclass(frozen=True)
class LaunchInfo:
    launcher: str  # torchrun, horovodrun, openmpi, mpich, slurm, single or gossip-rejoin
    rank: int
    world_size: int
    local_rank: Optional[int] = None
    local_size: Optional[int] = None
    node_rank: Optional[int] = None

    @property
    def mpi(self) -> bool:
        """True when an MPI launcher started us, so MPI can carry the rendezvous."""
        return self.launcher in MPI_LAUNCHERS


# Set by `commbench gossip` (commbench.faults.gossip_launch) for a rank it starts again
# after its +REJOIN under --recovery gossip: first, since its environment may be a
# launcher's own.
REJOINING = "gossip-rejoin"
REJOIN_RANK = "COMMBENCH_GOSSIP_REJOIN"
REJOIN_WORLD = "COMMBENCH_GOSSIP_WORLD"

# launcher -> (rank, size, local rank, local size, node index): each the variable that
# holds it, or the variables that may, first found wins. The first two must be present
# for the launcher to be recognised.
Names = Union[None, str, Tuple[str, ...]]
LAUNCHER_VARIABLES: Tuple[Tuple[str, Tuple[Names, ...]], ...] = (
    (REJOINING, (REJOIN_RANK, REJOIN_WORLD, None, None, None)),
    ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")),
    ("horovodrun", ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                    "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK")),
    ("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK")),
    # PMI_*: MPICH's Hydra and Intel MPI (local values MPI_LOCAL*), Cray MPICH
    # (PMI_LOCAL_*), and srun --mpi=pmi2, which leaves the local rank to SLURM_LOCALID.
    ("mpich", ("PMI_RANK", "PMI_SIZE", ("MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"),
               ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"), None)),
    ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None, "SLURM_NODEID")),
)


# Set by `commbench torchft` for each replica group it starts: a world of one, whose
# only rank is 0 in every group (commbench.faults.torchft_group).
REPLICA_GROUP = "COMMBENCH_TORCHFT_GROUP"


def who(environ: Mapping[str, str] = os.environ) -> str:
    """How this process's lines name it: `rank R`, or `replica group G` under torchft."""
    if environ.get(REPLICA_GROUP):
        return f"replica group {environ[REPLICA_GROUP]}"
    try:
        return f"rank {detect_launch(environ).rank}"
    except Exception:
        return "rank ?"


def detect_launch(environ: Mapping[str, str] = os.environ) -> LaunchInfo:
    for launcher, names in LAUNCHER_VARIABLES:
        rank_var, size_var = names[0], names[1]
        if rank_var not in environ or size_var not in environ:
            continue
        values = [_read_int(environ, name) for name in names]
        if launcher == "slurm":
            values[3] = _slurm_local_size(environ, values[4])
        info = LaunchInfo(launcher, *values)
        _check(info)
        return info
    return LaunchInfo("single", 0, 1, 0, 1, 0)


def _read_int(environ: Mapping[str, str], names: Names) -> Optional[int]:
    for name in (names,) if isinstance(names, str) else names or ():
        if name in environ:
            try:
                return int(environ[name])
            except ValueError:
                raise UsageError(f"environment variable {name}={environ[name]!r} is not an "
                                 "integer")
    return None


def _slurm_local_size(environ: Mapping[str, str], node: Optional[int]) -> Optional[int]:
    """Tasks on this node from SLURM_TASKS_PER_NODE, e.g. '2(x3),1' = 2,2,2,1."""
    text = environ.get("SLURM_TASKS_PER_NODE") or environ.get("SLURM_STEP_TASKS_PER_NODE")
    if not text or node is None:
        return None
    counts = []
    for part in text.split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts[node] if node < len(counts) else None


def _check(info: LaunchInfo) -> None:
    if info.world_size < 1 or not 0 <= info.rank < info.world_size:
        raise UsageError(f"{info.launcher} says rank {info.rank} of world size "
                         f"{info.world_size}, which is impossible")
