"""Set up torch.distributed for whichever launcher started us.

Rendezvous, in order: the launcher's MASTER_ADDR/MASTER_PORT (torchrun, or a user
who sets them); under an MPI launcher, rank 0's address and a free port shared over
MPI (mpi4py); under Slurm, the job's first host and a port derived from the job
id (as Lightning does); under horovodrun's gloo controller, Horovod's own
broadcast. Backend: NCCL on `cuda:local_rank`, gloo on the CPU.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

from commbench.errors import UsageError
from commbench.failure import mpi_deadline
from commbench.launch.detect import LaunchInfo


@dataclass(frozen=True)
class DistContext:
    """Everything a plugin and the loop need to know about the job."""

    launch: LaunchInfo  # with local rank/size and node index filled in
    device: "object"  # torch.device
    backend: str
    hostnames: Tuple[str, ...]  # one per rank
    machine_size: int  # ranks per machine (real, or simulated); 0 if machines differ in size
    simulated_machines: bool
    gpu_names: Tuple[Optional[str], ...] = ()  # one per rank, on GPUs
    cores: Tuple[int, ...] = ()  # physical cores of each rank's machine
    # the real machine of each rank: its hostname, or on an emulated cluster the host
    # all emulated machines share
    physical_hosts: Tuple[str, ...] = ()

    def machine_load(self) -> List[Tuple[str, int, int]]:
        """(machine, workers on it, its physical cores) of every real machine: the host,
        on an emulated cluster, since all its machines share its cores."""
        hosts = self.physical_hosts or self.hostnames
        return [(h, hosts.count(h), self.cores[hosts.index(h)]) for h in dict.fromkeys(hosts)]

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def num_machines(self) -> int:
        if self.machine_size:
            return self.world_size // self.machine_size
        return len(set(self.hostnames))  # machines of unequal sizes

    @property
    def machine(self) -> int:
        return self.rank // self.machine_size

    @property
    def device_kind(self) -> str:
        """What a worker is called in output: GPU on CUDA, worker otherwise."""
        return "GPU" if getattr(self.device, "type", "cpu") == "cuda" else "worker"


def init_distributed(info: LaunchInfo, no_cuda: bool, timeout: float,
                     machine_size: Optional[int] = None) -> DistContext:
    import torch
    import torch.distributed as dist

    use_cuda = torch.cuda.is_available() and not no_cuda
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        _nccl_errors_end_the_job()
        if info.local_rank is not None and _gpu_index(info.local_rank) < torch.cuda.device_count():
            torch.cuda.set_device(_gpu_index(info.local_rank))
    options = dict(backend=backend, rank=info.rank, world_size=info.world_size,
                   timeout=timedelta(seconds=timeout))
    if dist.is_initialized():
        pass  # embedded in a program that set up torch.distributed itself (e.g. benchmarks/)
    elif info.world_size == 1:
        dist.init_process_group(store=dist.HashStore(), **options)
    else:
        addr, port = _rendezvous_address(info)
        dist.init_process_group(init_method=f"tcp://{_bracket(addr)}:{port}", **options)

    # MPI calls (mpi4py transports) and subgroups get the same patience as the job's group.
    mpi_deadline.seconds = timeout
    _SUBGROUPS.timeout = timedelta(seconds=timeout)
    hosts, group = _exchange_hosts(backend)
    hostnames = [h for h, _, _ in hosts]
    physical_hosts = tuple(p for _, _, p in hosts)
    info = _fill_node_layout(info, hostnames)
    gpu_names: Tuple[Optional[str], ...] = ()
    if use_cuda:
        index = _gpu_index(info.local_rank)
        gpus = _gather(_claim(index), group)
        _check_one_gpu_each(hostnames, gpus)
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        gpu_names = tuple(name for _, _, name in gpus)
    else:
        device = torch.device("cpu")
        _share_cores(physical_hosts.count(physical_hosts[info.rank]))

    simulated = machine_size is not None
    if simulated:
        # Only strategies that use machines care; they reject a size that does not divide.
        machine_size = machine_size if info.world_size % machine_size == 0 else 0
    else:
        machine_size = _real_machine_size(info, hostnames)
    return DistContext(info, device, backend, tuple(hostnames), machine_size, simulated,
                       gpu_names, tuple(c for _, c, _ in hosts), physical_hosts)


def _nccl_errors_end_the_job() -> None:
    """NCCL's watchdog ends the job when a collective fails or outlasts --timeout;
    without it a dead peer leaves the others waiting in a CUDA sync (older torch).
    Both spellings: torch >= 2.2 reads TORCH_NCCL_*, older torch NCCL_*."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    os.environ.setdefault("NCCL_ASYNC_ERROR_HANDLING", "1")


def _exchange_hosts(backend: str) -> Tuple[List[Tuple[str, int, str]], Any]:
    """Every rank's hostname, its machine's physical cores and its real machine,
    gathered over gloo: a rank must be on its own GPU before the first NCCL operation,
    and which GPU is its own follows from these hostnames when the launcher did not
    say. Also the gloo group used (None: the job's own)."""
    import torch.distributed as dist

    from commbench.environment import emulated_network, physical_cores

    group = None
    if backend != "gloo":
        group = dist.new_group(backend="gloo", timeout=_SUBGROUPS.timeout)
    name = socket.gethostname()
    real = (emulated_network() or {}).get("host", name)
    return [tuple(h) for h in _gather((name, physical_cores(), real), group)], group


def _gather(mine: Any, group: Any) -> List[Any]:
    import torch.distributed as dist

    everyone: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine, group=group)
    return everyone


def _gpu_index(local_rank: int) -> int:
    """This rank's GPU: its local rank, or the only GPU it sees (a launcher that gives
    each rank its own CUDA_VISIBLE_DEVICES, as `srun --gpus-per-task=1` does)."""
    import torch

    return 0 if torch.cuda.device_count() == 1 else local_rank


def _claim(index: int) -> Tuple[Optional[str], int, Optional[str]]:
    """(CUDA_VISIBLE_DEVICES, GPU index, GPU name) of this rank: two ranks of one
    machine with equal visible devices and index would share a GPU."""
    import torch

    gpus = torch.cuda.device_count()
    name = torch.cuda.get_device_name(index) if index < gpus else None
    return os.environ.get("CUDA_VISIBLE_DEVICES"), index, name


def _check_one_gpu_each(hostnames: List[str], claims: List[Any]) -> None:
    """Every rank sees every rank's claim, so every rank stops here alike."""
    for host in dict.fromkeys(hostnames):
        mine = [(visible, index, name) for h, (visible, index, name) in zip(hostnames, claims)
                if h == host]
        gpus = {(visible, index) for visible, index, name in mine if name is not None}
        if len(gpus) < len(mine):
            raise UsageError(f"machine {host} runs {len(mine)} ranks but they have only "
                             f"{len(gpus)} GPU(s) between them: start at most one rank per "
                             "GPU, or pass --no-cuda")


class _Subgroups:
    """Process groups over parts of the job, made once per job and layout."""

    def __init__(self) -> None:
        self.timeout: Optional[timedelta] = None
        self._machines: Dict[int, List[Any]] = {}

    def forget(self) -> None:
        self._machines.clear()

    def machines(self, machine_size: int, world_size: int) -> List[Any]:
        """One group per machine of machine_size consecutive ranks. Collective: every
        rank calls it with the same sizes, in the same order."""
        import torch.distributed as dist

        if machine_size not in self._machines:
            options = {"timeout": self.timeout} if self.timeout else {}
            self._machines[machine_size] = [
                dist.new_group(list(range(m, m + machine_size)), **options)
                for m in range(0, world_size, machine_size)]
        return self._machines[machine_size]


_SUBGROUPS = _Subgroups()
machine_groups = _SUBGROUPS.machines


def _rendezvous_address(info: LaunchInfo) -> Tuple[str, int]:
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


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def _fill_node_layout(info: LaunchInfo, hostnames: List[str]) -> LaunchInfo:
    """Local rank/size and node index from the hostnames where the launcher is silent."""
    nodes = list(dict.fromkeys(hostnames))  # in order of first appearance
    mine = hostnames[info.rank]
    return replace(
        info,
        local_rank=info.local_rank if info.local_rank is not None
        else hostnames[:info.rank].count(mine),
        local_size=info.local_size if info.local_size is not None else hostnames.count(mine),
        node_rank=info.node_rank if info.node_rank is not None else nodes.index(mine),
    )


def _real_machine_size(info: LaunchInfo, hostnames: List[str]) -> int:
    """Ranks per machine; 0 when machines hold different numbers of ranks."""
    counts = {hostnames.count(h) for h in hostnames}
    contiguous = all(hostnames[r] == hostnames[r - r % info.local_size]
                     for r in range(info.world_size)) if len(counts) == 1 else False
    return counts.pop() if len(counts) == 1 and contiguous else 0


def _share_cores(workers_on_this_host: int) -> None:
    """Give each CPU worker its share of its real machine's cores (on an emulated
    cluster: the host's, shared by the workers of every emulated machine).

    torch uses every core by default, so N workers on one machine would each run
    N-fold oversubscribed. torchrun sets OMP_NUM_THREADS=1 for the same reason;
    an explicit OMP_NUM_THREADS wins.
    """
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, workers_on_this_host)))


def leave_libraries() -> None:
    """Leave torch.distributed, Horovod, Bluefog and MPI, whichever this process
    started, in that order (MPI last: the others run on it); every rank of a job that
    ended alike calls it, so their collective shutdowns meet."""
    import sys

    dist = sys.modules.get("torch.distributed")
    _SUBGROUPS.forget()
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()
    bf = sys.modules.get("bluefog.torch")
    if bf is not None:
        bf.shutdown()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
