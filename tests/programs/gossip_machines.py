"""`mpiexec --enable-recovery -n 6 python gossip_machines.py KIND`: hierarchical averaging
over 3 simulated machines of 2 ranks along the one-peer schedule of exponential-2, through
--recovery gossip's mixer (commbench.faults.gossip_machines), where rank 3 kills (KIND
kill) or stops (stop) itself at step 1, before consensus, and the others go on around
it with its machine one rank short; for tests/test_gossip_machines.py.

Every step the survivors take together is checked against a dense reference built here
from the ranks' own matrix: W_M kron J_2/2 with the lost rank bypassed (its senders'
weights handed to its receivers). Rank 0 prints one JSON line: the lost ranks, the
steps checked and the largest error, the survivors' mean when they met and at the end,
and how far they were from it then."""

import datetime
import json
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from commbench.faults.gossip_machines import SurvivingMachines
from commbench.faults.gossip_survival import Survival
from commbench.topology import build_schedule
from gossip_survivors import TIMEOUT, meeting_store

STEPS, FAILS_AT, VICTIM, MACHINE = 40, 1, 3, 2


class Members:
    """What the mixer asks of commbench.faults.gossip_recovery's Gossip: the ranks as
    started, the survivors, their agreement in the store, and the group made again."""

    def __init__(self, store, rank: int, size: int):
        self.store, self.me = store, rank
        self.survivors = list(range(size))
        self.survival = Survival(store, rank, size, TIMEOUT)
        self.met = None

    def lost(self, step, found):
        self.survival.announce(found)
        self.met = self.survival.meet(step)
        self.survivors = list(self.met.survivors)
        dist.destroy_process_group()
        dist.init_process_group("gloo", store=dist.PrefixStore(
            f"group-{self.survival.generation}", self.store),
            rank=self.survivors.index(self.me), world_size=len(self.survivors),
            timeout=datetime.timedelta(seconds=TIMEOUT))
        return self.met

    def exchanged(self):
        pass


def bypassed(w: np.ndarray, lost: int) -> np.ndarray:
    kept = [r for r in range(w.shape[0]) if r != lost]
    return w[np.ix_(kept, kept)] + np.outer(w[kept, lost], w[lost, kept]) / (1 - w[lost, lost])


def reference(schedule, step: int, size: int, lost) -> np.ndarray:
    """The survivors' rank matrix at `step`: the ranks' own, the lost ranks bypassed."""
    w = np.kron(schedule.at(step).weights, np.full((MACHINE, MACHINE), 1 / MACHINE))
    for rank in sorted(lost, reverse=True):
        w = bypassed(w, rank)
    return w


def rows(x) -> np.ndarray:
    gathered = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, x)
    return torch.stack(gathered).numpy()


def main() -> None:
    from mpi4py import MPI

    kind = sys.argv[1]
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    store = meeting_store(rank, size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    store.set(f"pid/{rank}", str(os.getpid()))
    schedule = build_schedule("exponential-2", size // MACHINE, dynamic=True)
    members = Members(store, rank, size)
    members.survival.beat()
    mixer = SurvivingMachines([torch.arange(8, dtype=torch.float64) * (rank + 1) ** 2],
                              schedule, MACHINE, members)
    x = mixer.buffers[0]
    facts, checked, error, found = {}, 0, 0.0, None
    for step in range(STEPS):
        if step == FAILS_AT and rank == VICTIM:
            store.set("failed-at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        met = members.met
        if met is not None and step == met.resume_step:  # every survivor has met by now
            everyone = rows(x)
            facts = dict(lost=list(met.lost), resume_step=met.resume_step,
                         detection_seconds=found - float(store.get("failed-at")),
                         mean_at_meeting=everyone.mean(axis=0).tolist(),
                         spread_at_meeting=float(np.abs(everyone - everyone.mean(0)).max()))
        mixes = met is not None and step >= met.resume_step
        before = rows(x) if mixes else None
        mixer.start()
        mixer.finish()
        if members.met is not met:
            found = time.time()
        elif mixes:
            want = reference(schedule, step, size, met.lost) @ before
            error = max(error, float(np.abs(rows(x) - want).max()))
            checked += 1
    everyone = rows(x)
    if rank == 0:
        print(json.dumps(dict(facts, checked=checked, error=error,
                              mean_at_end=everyone.mean(axis=0).tolist(),
                              spread_at_end=float(np.abs(everyone - everyone.mean(0)).max()))),
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
