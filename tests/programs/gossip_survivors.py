"""`mpiexec --enable-recovery -n 4 python gossip_survivors.py KIND`: neighbor
averaging over gloo along the one-peer schedule of exponential-2, where rank 2 kills
(KIND kill) or stops (stop) itself at exchange 1, before consensus, and the others go on around it
(commbench.faults.gossip_survival, commbench.topology.survivors), for
tests/test_gossip_survival.py.

Rank 0 prints one JSON line: the lost ranks, the exchange the survivors resumed at, how
long after the failure the first survivor found it lost, the survivors' mean when they
met and at the end (equal: every mixing step after the failure keeps it), and how far the
survivors then were from their mean, before the failure and at the end."""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from commbench.faults.gossip_exchange import posted
from commbench.faults.gossip_survival import Survival, waited
from commbench.topology import build_schedule
from commbench.topology.survivors import survivors_schedule

STEPS, FAILS_AT, VICTIM, TIMEOUT = 40, 1, 2, 10.0
PORT_TAG = 38_101


def meeting_store(rank: int, size: int) -> "dist.TCPStore":
    """Rank 0 serves on a port the system picks, so no other process can take it first,
    and sends it over MPI; a rank that hears nothing in TIMEOUT s fails rather than wait
    (under --enable-recovery mpiexec would not end it)."""
    from mpi4py import MPI

    comm, patience = MPI.COMM_WORLD, datetime.timedelta(seconds=30)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, size, True, patience, wait_for_workers=False)
        for peer in range(1, size):
            comm.send(store.port, dest=peer, tag=PORT_TAG)
        return store
    deadline = time.monotonic() + TIMEOUT
    while not comm.iprobe(source=0, tag=PORT_TAG):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 sent no port within {TIMEOUT:g} s")
        time.sleep(0.05)
    port = comm.recv(source=0, tag=PORT_TAG)
    return dist.TCPStore("127.0.0.1", port, size, False, patience)


def exchange(x, schedule, survivors, rank, step, epoch, survival):
    """One mixing step of x (None: a peer was lost, or another rank said one was)."""
    node = survivors.index(rank)
    weights = schedule.at(step).weights
    sources = [j for j in range(len(survivors)) if j != node and weights[node, j] > 0]
    targets = [i for i in range(len(survivors)) if i != node and weights[i, node] > 0]
    tag = epoch * 1_000_000 + step  # an abandoned exchange's messages never match again
    received = {j: torch.empty_like(x) for j in sources}
    messages = ([(survivors[i], posted("send", x, survivors[i], tag)) for i in targets]
                + [(survivors[j], posted("recv", received[j], survivors[j], tag))
                   for j in sources])
    lost, news = waited(messages, survival)
    if lost:
        survival.announce(lost)
    if lost or news:
        return None
    return x * weights[node, node] + sum(received[j] * weights[node, j] for j in sources)


def survivors_mean(x, group, count):
    total = x.clone()
    dist.all_reduce(total, group=group)
    return total / count


def main() -> None:
    from mpi4py import MPI

    kind = sys.argv[1]
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    store = meeting_store(rank, size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    store.set(f"pid/{rank}", str(os.getpid()))
    full = build_schedule("exponential-2", size, dynamic=True)
    schedule, survivors, epoch = full, list(range(size)), 0
    survival = Survival(store, rank, size, TIMEOUT)
    survival.beat()
    x = torch.arange(8, dtype=torch.float64) * (rank + 1) ** 2  # no two alike
    step, skip_until, facts = 0, 0, {}
    while step < STEPS:
        if step == FAILS_AT and rank == VICTIM:
            store.set("failed-at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        mixed = x if step < skip_until else exchange(x, schedule, survivors, rank, step,
                                                     epoch, survival)
        if mixed is None:
            found = time.time()
            met = survival.meet(step)
            survivors, epoch, skip_until = list(met.survivors), epoch + 1, met.resume_step
            schedule = survivors_schedule(full, met.lost)
            group = dist.new_group(survivors, use_local_synchronization=True)
            mean = survivors_mean(x, group, len(survivors))
            facts = dict(lost=list(met.lost), resume_step=met.resume_step,
                         detection_seconds=found - float(store.get("failed-at")),
                         mean_at_meeting=mean.tolist(),
                         spread_at_meeting=float((x - mean).abs().max()))
            continue  # the abandoned exchange counts as taken: step goes on alike
        x, step = mixed, step + 1
    mean = survivors_mean(x, group, len(survivors))
    spread = torch.tensor([float((x - mean).abs().max())])
    dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=group)
    if rank == 0:
        print(json.dumps(dict(facts, mean_at_end=mean.tolist(), spread_at_end=float(spread))),
              flush=True)
        if kind == "stop":  # a stopped rank would keep mpiexec waiting for ever
            os.kill(int(store.get(f"pid/{VICTIM}")), signal.SIGKILL)
    sys.stdout.flush()
    os._exit(0)  # MPI_Finalize would wait for the lost rank


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # one line, and no wait in teardown for the lost rank
        print(f"rank {os.environ.get('OMPI_COMM_WORLD_RANK')}: {type(error).__name__}: "
              f"{error}", file=sys.stderr, flush=True)
        os._exit(1)
