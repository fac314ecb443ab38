"""Set up torch.distributed for whichever launcher started us, and leave it at the end.

The ranks meet as commbench.launch.rendezvous finds, in a store where rank 0 takes a
roll call (so that a rank that never arrives is named after --timeout, not waited for,
as is one that stops before the process group or the first exchange: late_ranks);
backend NCCL on one GPU per rank (commbench.launch.gpus), gloo on the CPU; every rank
learns every rank's machine, fills in what the launcher did not say and takes its share
of the machine's cores.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

from commbench.job.failure import mpi_deadline, name_ranks, patience_for_rank_0, startup_failed
from commbench.launch import gpus
from commbench.launch.detect import LaunchInfo
from commbench.launch.groups import SUBGROUPS
from commbench.launch.late_ranks import LateRanks
from commbench.launch.lost_machine import NO_ANSWER
from commbench.launch.rendezvous import Meeting, bracket, poll_until, rendezvous_address


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
    # what each rank's machine says of its network and GPUs (environment.machine_facts)
    machine_facts: Tuple[Dict[str, Any], ...] = ()

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
        gpus.nccl_errors_end_the_job()
        own = None if info.local_rank is None else gpus.gpu_index(info.local_rank)
        if own is not None and own < torch.cuda.device_count():
            torch.cuda.set_device(own)
    options = dict(backend=backend, rank=info.rank, world_size=info.world_size,
                   timeout=timedelta(seconds=timeout))
    late = LateRanks(None, info.rank, info.world_size, timeout)
    if dist.is_initialized():
        pass  # embedded in a program that set up torch.distributed itself (e.g. benchmarks/)
    elif info.world_size == 1:
        dist.init_process_group(store=dist.HashStore(), **options)
    else:
        meeting = rendezvous_address(info, timeout)
        store = _roll_call(meeting, info, timeout)
        late = LateRanks(store, info.rank, info.world_size, timeout, meeting.hosts)
        with late.step("torch.distributed's process group"):
            dist.init_process_group(store=store, **options)

    # MPI calls (mpi4py transports) and subgroups get the same patience as the job's group.
    mpi_deadline.seconds = timeout
    SUBGROUPS.timeout = timedelta(seconds=timeout)
    hosts, group = _exchange_hosts(backend, use_cuda, late)
    hostnames = [h for h, _, _, _ in hosts]
    physical_hosts = tuple(p for _, _, p, _ in hosts)
    info = _fill_node_layout(info, hostnames)
    gpu_names: Tuple[Optional[str], ...] = ()
    if use_cuda:
        index = gpus.gpu_index(info.local_rank)
        claims = _gather(gpus.claim(index), group)
        gpus.check_one_gpu_each(hostnames, claims)
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        gpu_names = tuple(name for _, _, name in claims)
    else:
        device = torch.device("cpu")
        share_cores(physical_hosts.count(physical_hosts[info.rank]))

    simulated = machine_size is not None
    if simulated:
        # Only strategies that use machines care; they reject a size that does not divide.
        machine_size = machine_size if info.world_size % machine_size == 0 else 0
    else:
        machine_size = _real_machine_size(info, hostnames)
    return DistContext(info, device, backend, tuple(hostnames), machine_size, simulated,
                       gpu_names, tuple(c for _, c, _, _ in hosts), physical_hosts,
                       tuple(f for _, _, _, f in hosts))


def _roll_call(meeting: Meeting, info: LaunchInfo, timeout: float) -> Any:
    """The store torch.distributed's ranks meet in, once every rank has reported to it.

    Outside torchrun, torch's own tcp:// rendezvous makes rank 0 wait for the others
    inside the store's constructor, and its timeout names nobody. Here each rank reports
    its machine under its own key instead, so rank 0 can name the ranks that did not
    arrive."""
    where = f"torch.distributed's rendezvous (tcp://{bracket(meeting.addr)}:{meeting.port})"
    store = _store(meeting, info, timeout, where)
    # Counters, read by adding 0: the one store operation that neither blocks nor is
    # missing from older torch (1.10 has no `check`).
    store.add(f"commbench/arrived/{info.rank}", 1)
    store.add("commbench/arrivals", 1)
    if info.rank == 0:
        # Polled (rank 0 asks its own server): a store wait that times out has torch log
        # lines of its own before ours.
        def everyone() -> bool:
            return store.add("commbench/arrivals", 0) >= info.world_size

        if not poll_until(time.monotonic() + timeout, everyone):
            missing = [r for r in range(info.world_size)
                       if store.add(f"commbench/arrived/{r}", 0) == 0]
            startup_failed(f"{name_ranks(missing, meeting.hosts)} of {info.world_size} did "
                           f"not arrive at {where} within {timeout:g} s (--timeout)")
        store.set("commbench/all-arrived", "1")
    else:
        patience = patience_for_rank_0(timeout)
        try:
            store.wait(["commbench/all-arrived"], timedelta(seconds=patience))
        except RuntimeError as e:
            if not NO_ANSWER.search(str(e)):
                raise
            startup_failed(f"rank 0 did not answer at {where} within {patience:g} s "
                           "(--timeout, and time for rank 0 to report)")
    return store


def _store(meeting: Meeting, info: LaunchInfo, timeout: float, where: str) -> Any:
    """A TCPStore at the meeting point, as torch's tcp:// rendezvous makes it (under
    torchrun, a client of the agent's store), except that rank 0's server does not wait
    for the others: the roll call does."""
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and \
        os.environ.get("MASTER_ADDR") == meeting.addr and \
        os.environ.get("MASTER_PORT") == str(meeting.port)
    serves = info.rank == 0 and not agent
    try:
        store = dist.TCPStore(meeting.addr, meeting.port, info.world_size, serves,
                              timedelta(seconds=timeout), wait_for_workers=False)
    except RuntimeError as e:
        if serves or not NO_ANSWER.search(str(e)):
            raise
        startup_failed(f"rank 0 did not answer at {where} within {timeout:g} s (--timeout)")
    if agent:  # as torch keeps one restart's keys apart from the next's
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"/worker/attempt_{attempt}", store)
    return store


def _exchange_hosts(backend: str, use_cuda: bool, late: LateRanks
                    ) -> Tuple[List[Tuple[str, int, str, Dict[str, Any]]], Any]:
    """Every rank's hostname, its machine's physical cores, its real machine and what
    the machine says of its network and GPUs, gathered over gloo: a rank must be on its
    own GPU before the first NCCL operation, and which GPU is its own follows from these
    hostnames when the launcher did not say. Also the gloo group used (None: the job's
    own). The job's first exchange: a rank that does not come is named (`late`)."""
    import torch.distributed as dist

    from commbench.result.environment import emulated_network, machine_facts, physical_cores

    group = None
    if backend != "gloo":
        group = dist.new_group(backend="gloo", timeout=SUBGROUPS.timeout)
    name = socket.gethostname()
    real = (emulated_network() or {}).get("host", name)
    mine = (name, physical_cores(), real, machine_facts(use_cuda))
    with late.step("the first exchange (every rank's machine, over gloo)"):
        return [tuple(h) for h in _gather(mine, group)], group


def _gather(mine: Any, group: Any) -> List[Any]:
    import torch.distributed as dist

    everyone: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine, group=group)
    return everyone


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


def share_cores(workers_on_this_host: int) -> None:
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
    SUBGROUPS.forget()
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()
    bf = sys.modules.get("bluefog.torch")
    if bf is not None:
        if bf.get_current_created_window_names():  # win_put's windows: freed together
            bf.win_free()
        bf.shutdown()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
