"""`mpiexec --enable-recovery -n 4 python gossip_rejoin.py`: four ranks, each a Linear
model of its own with SGD's momentum, average their parameters over gloo along the
one-peer schedule of exponential-2; rank 2 kills itself at exchange 1, the others go on
around it, and rank 0 starts a fresh rank 2 (`gossip_rejoin.py newcomer PORT`, outside
mpiexec) that asks to be admitted again. At exchange 10 the members admit it
(commbench.faults.gossip_survival), make the group again with it, and it takes the
survivors' mean and rank 0's momentum (commbench.faults.gossip_rejoin.hand_over); all
four then mix along the full schedule, for tests/test_gossip_rejoin.py.

Rank 0 prints one JSON line: the lost ranks, the survivors' mean at the admission, what
the newcomer took, its momentum and rank 0's, the members' mean at the end (equal to the
mean at the admission: the admission and every mixing step keep it) and their spread."""

import datetime
import json
import os
import signal
import subprocess
import sys

import torch
import torch.distributed as dist

from commbench.faults.gossip_rejoin import hand_over
from commbench.faults.gossip_survival import PREFIX, Survival
from commbench.topology import build_schedule
from commbench.topology.survivors import survivors_schedule
from gossip_survivors import exchange, meeting_store, survivors_mean

STEPS, FAILS_AT, ADMIT_AT, VICTIM, SIZE, TIMEOUT = 30, 1, 10, 2, 4, 10.0
ADMITTED_EPOCH = 100  # the tags of the exchanges in the group made with the newcomer


def trained(seed):
    """A Linear model and its SGD after one step of its own: momentum to hand over."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.full((3, 4), float(seed), dtype=torch.float64)).pow(2).sum().backward()
    optimizer.step()
    return model, optimizer


def flat(model):
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def momentum(model, optimizer):
    return torch.cat([optimizer.state[p]["momentum_buffer"].reshape(-1)
                      for p in model.parameters()]).tolist()


def admitted(store, survival, rank, met, model, optimizer):
    """Every member and the newcomer: the group made again with all of `met.survivors`,
    the newcomer given the survivors' mean; (that mean, what each took, momenta)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore(
        f"{PREFIX}/group-{survival.generation}", store), rank=met.survivors.index(rank),
        world_size=len(met.survivors), timeout=datetime.timedelta(seconds=TIMEOUT))
    newcomer = rank in met.joined
    survivors = len(met.survivors) - len(met.joined)
    mean = survivors_mean(flat(model) * (0 if newcomer else 1), None, survivors)
    hand_over(model, optimizer, newcomer, survivors)
    everyone = [None] * len(met.survivors)
    dist.all_gather_object(everyone, (flat(model).tolist(), momentum(model, optimizer)))
    return {"mean_at_admission": mean.tolist(), "newcomer_took": everyone[VICTIM][0],
            "newcomer_momentum": everyone[VICTIM][1], "rank_0_momentum": everyone[0][1]}


def mix(model, step, survival, rank, facts):
    """From exchange `step` to the end along the full schedule, with everyone back; rank 0
    prints the facts."""
    full = build_schedule("exponential-2", SIZE, dynamic=True)
    members = list(range(SIZE))
    while step < STEPS:
        x = exchange(flat(model), full, members, rank, step, ADMITTED_EPOCH, survival)
        if x is None:
            raise RuntimeError(f"a rank was lost after the admission, at exchange {step}")
        torch.nn.utils.vector_to_parameters(x, model.parameters())
        step += 1
    mean = survivors_mean(flat(model), None, SIZE)
    spread = torch.tensor([float((flat(model) - mean).abs().max())])
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps(dict(facts, mean_at_end=mean.tolist(), spread_at_end=float(spread))),
              flush=True)


def member() -> None:
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    store = meeting_store(rank, SIZE)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=SIZE,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    full = build_schedule("exponential-2", SIZE, dynamic=True)
    schedule, survivors, epoch, skip_until = full, list(range(SIZE)), 0, 0
    survival = Survival(store, rank, SIZE, TIMEOUT)
    survival.beat()
    model, optimizer = trained(rank + 1)
    step, facts, started = 0, {}, None
    while step < ADMIT_AT:
        if step == FAILS_AT and rank == VICTIM:
            os.kill(os.getpid(), signal.SIGKILL)
        x = flat(model)
        mixed = x if step < skip_until else exchange(x, schedule, survivors, rank, step,
                                                     epoch, survival)
        if mixed is None:
            met = survival.meet(step)
            survivors, epoch, skip_until = list(met.survivors), epoch + 1, met.resume_step
            schedule, facts = survivors_schedule(full, met.lost), {"lost": list(met.lost)}
            if rank == 0:  # a fresh process, as `commbench gossip` starts one
                started = subprocess.Popen(
                    [sys.executable, __file__, "newcomer", str(store.port)],
                    stdout=subprocess.DEVNULL, env={k: v for k, v in os.environ.items()
                                                    if not k.startswith(("OMPI_", "PMIX_"))})
            continue
        torch.nn.utils.vector_to_parameters(mixed, model.parameters())
        step += 1
    if rank == 0:  # the admission is tested, not the newcomer's start-up: wait for it
        store.wait([f"{PREFIX}/rejoin/{VICTIM}/0"], datetime.timedelta(seconds=120))
    met = survival.admit(step, survival.decide(step, {}))
    facts.update(admitted(store, survival, rank, met, model, optimizer))
    mix(model, step, survival, rank, facts)
    survival.part(SIZE)
    if started is not None:
        started.wait(30)
    sys.stdout.flush()
    os._exit(0)  # MPI_Finalize would wait for the lost rank


def newcomer(port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, SIZE, False, datetime.timedelta(seconds=30))
    survival = Survival(store, VICTIM, SIZE, TIMEOUT)
    survival.beat()
    survival.ask()
    met, record = survival.admitted()
    model, optimizer = trained(VICTIM + 10)  # its own start, unlike the survivors'
    admitted(store, survival, VICTIM, met, model, optimizer)
    mix(model, record["step"], survival, VICTIM, {})
    survival.part(SIZE)
    os._exit(0)


if __name__ == "__main__":
    try:
        newcomer(int(sys.argv[2])) if sys.argv[1:2] == ["newcomer"] else member()
    except Exception as error:  # one line, and no wait in teardown for the lost rank
        who = os.environ.get("OMPI_COMM_WORLD_RANK", f"{VICTIM} (the newcomer)")
        print(f"rank {who}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        os._exit(1)
