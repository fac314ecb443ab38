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
follows from the step it resumes at."""

from __future__ import annotations

from typing import Sequence

import numpy as np


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
