"""Stragglers made on purpose (`--slow-ranks R[,R...]:FACTOR[@P]`) in a projection: how
much longer each step takes when some ranks compute FACTOR times slower, given whom each
strategy waits for.

Synchronous strategies are a max-plus system: rank i ends step k when it has computed
and every rank it waits for that step has computed and sent,

    end_i(k) = max over j in waits_i(k) of (start_j(k) + compute_j(k)) + comm(k),
    start_i(k + 1) = end_i(k),

so a slow rank holds back the ranks that wait for it, and through them, step by step,
the ranks that wait for those. The communication of a step is the same for every rank,
so it shifts every end alike and cuts no delay short: the model leaves it out (a slow
rank's delay hidden behind a long transfer is not modelled). Whom a rank waits for is
the strategy's own: everyone for an allreduce (and the engines that negotiate over all
ranks), its in-neighbors at that step of the schedule for neighbor averaging, its
machine and the neighbor machines for the hierarchical step, everyone at a meeting and
no one between meetings for a periodic strategy. The step over a long run of steps, as
the job's img/sec sees it, is the projection; what it adds to the step without
stragglers is the stragglers' cost.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, List, Sequence, Union

import numpy as np

from commbench.job import straggler
from commbench.simulate import costs

STEPS = 512  # steps run: long enough for a delay to reach every rank and settle
EVERYONE, ALONE = "everyone", "alone"  # who a step waits for, where it is not a list
Waits = Union[str, np.ndarray, List[Sequence[int]]]


@functools.lru_cache(maxsize=64)
def waits(strategy, layout: "costs.Layout") -> Callable[[int], Waits]:
    """Step k -> whom each rank waits for that step: EVERYONE, ALONE (no one but itself),
    or for each rank the ranks it waits for (itself included)."""
    n = layout.workers
    name = strategy.base if strategy.name.startswith("bluefog.") else strategy.name
    if strategy.name.startswith("bluefog.") or name in ("allreduce", "horovod",
                                                        "gradient_allreduce"):
        return lambda step: EVERYONE
    if name in ("local_sgd", "diloco"):
        every = strategy.every[-1]
        return lambda step: EVERYONE if (step + 1) % every == 0 else ALONE
    from commbench.topology import build_schedule

    if name == "neighbor_allreduce":
        schedule = build_schedule(strategy.topology, n, strategy.dynamic,
                                  layout.local if layout.machines > 1 else None)
        return periodic(schedule, in_neighbors)
    if name == "hierarchical_neighbor_allreduce":
        g, m = layout.local, layout.machines
        if m == 1:
            return lambda step: EVERYONE
        schedule = build_schedule(strategy.topology, m, strategy.dynamic)
        return periodic(schedule, lambda at: [
            sorted({r for machine in {i // g, *at.in_neighbors(i // g)}
                    for r in range(machine * g, machine * g + g)}) for i in range(n)])
    return lambda step: ALONE  # none: no one to wait for


def in_neighbors(at) -> List[Sequence[int]]:
    """Each rank's in-neighbors in a mixing matrix (W[i, j] != 0: i takes j's value),
    itself among them."""
    rows, cols = np.nonzero(at.weights)
    found = np.split(cols, np.cumsum(np.bincount(rows, minlength=at.size))[:-1])
    return [sorted({i, *ranks.tolist()}) for i, ranks in enumerate(found)]


def periodic(schedule, whom: Callable[[object], List[Sequence[int]]]) -> Callable[[int], Waits]:
    """Whom each rank waits for at each step of a schedule, worked out once per phase of
    its period, as an index array (ranks x the most waited for, padded with the rank)."""
    phases: Dict[int, np.ndarray] = {}

    def at(step: int) -> np.ndarray:
        phase = step % schedule.period
        if phase not in phases:
            lists = whom(schedule.at(phase))
            width = max(len(ranks) for ranks in lists)
            phases[phase] = np.array([list(ranks) + [i] * (width - len(ranks))
                                      for i, ranks in enumerate(lists)])
        return phases[phase]

    return at


def mean_step(waited: Callable[[int], Waits], compute: np.ndarray) -> float:
    """The step of the max-plus system whose compute[step, rank] is given, in seconds, as
    the job's img/sec sees it: the workers' steps per second summed, over the second half
    of the steps, once a delay has spread (ranks that never wait for each other keep
    paces of their own)."""
    steps, workers = compute.shape
    start = np.zeros(workers)
    half = steps // 2
    middle = start
    for step in range(steps):
        if step == half:
            middle = start.copy()
        done = start + compute[step]
        whom = waited(step)
        if whom is EVERYONE:
            start = np.full(workers, done.max())
        elif whom is ALONE:
            start = done
        else:
            start = done[np.asarray(whom)].max(axis=1)
    per_rank = (start - middle) / (steps - half)
    return float(workers / np.sum(1.0 / per_rank))


def wait_seconds(strategy, layout: "costs.Layout", slow_text: str, compute_seconds: float,
                 seed: int = 42) -> float:
    """What stragglers made on purpose add to the step (as img/sec sees it): the
    max-plus system with the slowed ranks, less the step without them."""
    slow = straggler.parse(slow_text)
    n = layout.workers
    if not slow.on or n == 1:
        return 0.0
    ranks = np.zeros(n, dtype=bool)
    ranks[[r for r in slow.ranks if r < n]] = True
    slowed = ranks & (np.random.default_rng(seed).random((STEPS, n)) < slow.probability)
    compute = compute_seconds * np.where(slowed, slow.factor, 1.0)
    return max(0.0, mean_step(waits(strategy, layout), compute) - compute_seconds)
