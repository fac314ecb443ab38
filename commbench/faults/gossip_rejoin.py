"""A rank that comes back under `--recovery gossip` (issue 56: "a rejoining rank takes its
neighbours' average"): what it takes from the members once they admitted it
(commbench.faults.gossip_survival's admission, commbench.faults.gossip_recovery's
Gossip.join).

It takes the mean of ALL the survivors' parameters and floating-point buffers
(BatchNorm's running statistics), not the mean of its in-neighbours alone. Every mixing
step keeps the members' mean (the survivors' matrix, then the full W once all are back,
both doubly stochastic), so the mean is what the run has learnt; a newcomer that brought
its in-neighbours' average would move it by (theirs - the mean) / members, away from
what the survivors agreed on, and the run would then converge elsewhere. With the mean
of all, the members' mean is the survivors' exactly, and the newcomer starts at
consensus distance zero from it. Its optimizer state (momentum) and integer buffers are
rank 0's, a member's own, since they have no mean that stays one; its learning rate
follows from the step it resumes at.

The rank itself is started again by `commbench gossip` (commbench.faults.gossip_launch)
as the launcher gossip-rejoin (commbench.launch.detect): with no process group, it
reaches the job's store, where rank 0 recorded what the job is, and builds its context
from that record (`context`); then it asks to be admitted (Gossip.begin)."""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import timedelta
from typing import Any, Dict, Sequence

import numpy as np

from commbench.errors import UsageError
from commbench.faults.gossip_survival import PREFIX

# The job's store, as a rank started again reached it: Gossip's, with no process group.
JOINING: Dict[str, Any] = {}
# The job's context's values with one entry per rank.
PER_RANK = ("hostnames", "cores", "physical_hosts", "machine_facts")


def record(ctx, config) -> str:
    """What rank 0 records of the job for a rank started again: its world as started
    and the digest of its flags."""
    return json.dumps({"world_size": ctx.world_size, "machine_size": ctx.machine_size,
                       "simulated": ctx.simulated_machines,
                       "digest": config.started_alike()[0],
                       **{name: list(getattr(ctx, name)) for name in PER_RANK}}, default=str)


def context(launch, config):
    """The context of rank `launch.rank` started again (on the CPU, over gloo), from the
    job's record in its store; no process group, so that any collective before its
    admission fails loudly. UsageError where it was started with other flags."""
    import torch
    import torch.distributed as dist

    from commbench.launch.distributed import DistContext, share_cores

    from commbench.job import precision

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          launch.world_size, False, timedelta(seconds=config.timeout))
    job = json.loads(store.get(f"{PREFIX}/job"))
    # as the members recorded it: with --amp resolved (commbench.job.run), on the CPU
    config = dataclasses.replace(config, amp=precision.resolve(
        config.amp, config.language_model is not None, torch.device("cpu")))
    if job["digest"] != config.started_alike()[0] or job["world_size"] != launch.world_size:
        raise UsageError(f"rank {launch.rank} was started again with flags or a world size "
                         "other than the job's")
    hosts = job["hostnames"]
    mine = hosts[launch.rank]
    launch = dataclasses.replace(
        launch, local_rank=hosts[:launch.rank].count(mine), local_size=hosts.count(mine),
        node_rank=list(dict.fromkeys(hosts)).index(mine))
    share_cores(job["physical_hosts"].count(job["physical_hosts"][launch.rank]))
    JOINING["store"] = store
    return DistContext(launch, torch.device("cpu"), "gloo", tuple(hosts), job["machine_size"],
                       job["simulated"], (), *(tuple(job[name]) for name in PER_RANK[1:]))


def taken_over(rows: np.ndarray, newcomers: Sequence[int]) -> np.ndarray:
    """The members' values (one row each) once the `newcomers` among them took the mean of
    the others' rows, in float64: what hand_over does over the group."""
    rows = np.array(rows, dtype=np.float64)
    survivors = [r for r in range(rows.shape[0]) if r not in set(newcomers)]
    rows[list(newcomers)] = rows[survivors].mean(axis=0)
    return rows


def hand_over(model, optimizer, newcomer: bool, survivors: int) -> None:
    """Every member of the group just made (the survivors and the newcomers): a newcomer
    takes the survivors' mean of the parameters and floating-point buffers (one float64
    SUM, to which a newcomer adds zeros), and group rank 0's integer buffers and
    optimizer state."""
    import torch
    import torch.distributed as dist

    state = model.state_dict()
    floating = [k for k, v in state.items() if v.is_floating_point()]
    flat = torch.cat([state[k].detach().reshape(-1).double() for k in floating])
    if newcomer:
        flat.zero_()
    dist.all_reduce(flat)
    kept = [None if dist.get_rank() else (
        optimizer.state_dict(), {k: v for k, v in state.items() if k not in floating})]
    dist.broadcast_object_list(kept, src=0)
    if not newcomer:
        return
    flat /= survivors
    at = 0
    with torch.no_grad():
        for key in floating:
            value = state[key]
            value.copy_(flat[at:at + value.numel()].view_as(value))
            at += value.numel()
        for key, value in kept[0][1].items():
            state[key].copy_(value)
    optimizer.load_state_dict(kept[0][0])
