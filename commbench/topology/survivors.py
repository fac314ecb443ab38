"""The survivors' mixing matrix after ranks are lost: the mathematics of a gossip
recovery (issue 56), where the workers that remain average around the hole instead of
ending the job. Pure: weights in, weights out; commbench.faults.gossip_survival
is its runtime half, and `--recovery gossip` (commbench.faults.gossip_recovery) mixes
along it.

A lost rank's links are dropped and the weight a survivor gave it goes back to the
survivor's own self-loop, so each row still sums to one. Where the lost rank's links
were balanced (a symmetric W: ring, mesh-2d, star, symmetric exponential, fully
connected) that is all: the columns sum to one as well, so every mixing step keeps the
survivors' mean, and the matrix stays symmetric.

On a directed graph (exponential, the one-directional rings, every step of a dynamic
one-peer or inner-outer schedule) what a survivor gave the lost rank is not what it took
from it: with the self-loop alone the columns no longer sum to one, and the mean would
drift. No other weights on the same links help there: in a one-peer step every link lies
on one cycle, and a cycle broken by the hole could only carry mass one way, so keeping
the mean would cut those ranks off altogether. So the lost rank is bypassed instead:
what it would have passed on, its senders hand straight to its receivers,
W'[i, j] = W[i, j] + W[i, l] W[l, j] / (1 - W[l, l]) (the stochastic complement,
C. D. Meyer, "Stochastic complementation, uncoupling Markov chains", SIAM Review 1989),
which keeps rows and columns at one exactly, splices a broken cycle into a shorter one,
and adds links only from a lost rank's in-neighbours to its out-neighbours. Several
lost ranks are bypassed one after another (the order does not matter).

Survivors keep their order: row and column k of the result is the k-th surviving rank.
When a lost rank is admitted again (`--fail ...+REJOIN`), the members mix along the
matrix of the ranks still lost, computed afresh from the full W: the full W itself once
all are back, so W stays doubly stochastic at every step.

Hierarchical averaging (machines as nodes) loses ranks, not machines: its survivors'
matrix is the bypass of the ranks' own, W_M kron J_L/L (`survivors_machines`). Every
bypass keeps the ranks of a machine alike (rows and columns), so the result is again
an average inside each machine, mixed between machines, and broadcast back, with the
machine weights scaled by how many ranks each machine has left: a machine of fewer
survivors counts for fewer, and the survivors' mean stays the mean of all of them.
"""

from __future__ import annotations

from typing import Iterable, List, Tuple

import numpy as np

from commbench.topology.graphs import Topology
from commbench.topology.schedules import Schedule

# Below it a row or column sum is one.
BALANCED = 1e-13


def surviving_ranks(size: int, lost: Iterable[int]) -> List[int]:
    """The ranks of `size` that are not lost, in order; ValueError when none is left or
    a lost rank is not one of them."""
    gone = set(lost)
    if not gone <= set(range(size)):
        raise ValueError(f"lost ranks {sorted(gone)} are not all among {size} workers")
    kept = [r for r in range(size) if r not in gone]
    if not kept:
        raise ValueError(f"every one of the {size} workers is lost")
    return kept


def survivors_weights(weights: np.ndarray, lost: Iterable[int]) -> np.ndarray:
    """The survivors' mixing matrix (m x m, m survivors in rank order) of a doubly
    stochastic W with the `lost` ranks gone."""
    kept = surviving_ranks(weights.shape[0], lost)
    weights = np.array(weights, dtype=np.float64)
    w = _self_looped(weights[np.ix_(kept, kept)])
    if _is_balanced(w):
        return w
    for rank in sorted(set(range(weights.shape[0])) - set(kept), reverse=True):
        weights = _bypassed(weights, rank)  # from the highest, so the lower keep their index
    return weights


def survivors_topology(topology: Topology, lost: Iterable[int]) -> Tuple[List[int], Topology]:
    """(the surviving ranks, their topology) of a static topology with `lost` gone."""
    lost = list(lost)
    return (surviving_ranks(topology.size, lost),
            Topology(topology.name, survivors_weights(topology.weights, lost)))


def survivors_at(schedule: Schedule, lost: Iterable[int], step: int) -> Topology:
    """The survivors' topology at training step `step` of a (static or dynamic) schedule
    with `lost` gone: each step's matrix re-weighted alone, as each step mixes alone."""
    return Topology(schedule.name, survivors_weights(schedule.at(step).weights, lost))


def survivors_schedule(schedule: Schedule, lost: Iterable[int]) -> Schedule:
    """The schedule the survivors mix along from here on: each step's matrix of
    `schedule` with `lost` gone (survivors_at), node k the k-th surviving rank."""
    lost = tuple(lost)
    kept = surviving_ranks(schedule.size, lost)
    return Schedule(schedule.name, len(kept), schedule.kind, schedule.period,
                    lambda phase: survivors_weights(schedule.at(phase).weights, lost))


def survivors_machines(machine_weights: np.ndarray, machine_size: int,
                       lost: Iterable[int]) -> Tuple[List[List[int]], np.ndarray]:
    """(the surviving ranks of each machine with any left, their machines' mixing matrix
    M) of hierarchical averaging along `machine_weights` (W_M) over machines of
    `machine_size` ranks (rank r on machine r // machine_size), with `lost` gone. One
    step: each machine's leader takes M[a, b] of machine b's average; then every
    survivor holds its machine's row of the ranks' survivors' matrix (the bypass of W_M
    kron J_L/L), so rows of M sum to one and sum_a n_a M[a, b] = n_b (n: survivors per
    machine), which keeps the survivors' mean."""
    size = machine_size
    ranks = np.kron(np.asarray(machine_weights, dtype=np.float64), np.full((size, size), 1 / size))
    kept = surviving_ranks(ranks.shape[0], lost)
    for rank in sorted(set(range(ranks.shape[0])) - set(kept), reverse=True):
        ranks = _bypassed(ranks, rank)
    machines: List[List[int]] = []
    for rank in kept:
        if machines and machines[-1][0] // size == rank // size:
            machines[-1].append(rank)
        else:
            machines.append([rank])
    first = [kept.index(members[0]) for members in machines]
    counts = np.array([len(members) for members in machines], dtype=np.float64)
    return machines, ranks[np.ix_(first, first)] * counts


def _self_looped(w: np.ndarray) -> np.ndarray:
    """w with what each row misses of one given back to its diagonal."""
    w = w.copy()
    w[np.diag_indices_from(w)] += 1.0 - w.sum(axis=1)
    return w


def _is_balanced(w: np.ndarray) -> bool:
    return bool(np.abs(w.sum(axis=0) - 1.0).max() <= BALANCED
                and np.abs(w.sum(axis=1) - 1.0).max() <= BALANCED)


def _bypassed(w: np.ndarray, lost: int) -> np.ndarray:
    """w without rank `lost`, its senders' weights handed on to its receivers."""
    kept = [r for r in range(w.shape[0]) if r != lost]
    out = w[np.ix_(kept, kept)]
    passes_on = 1.0 - w[lost, lost]
    if passes_on > 0.0:  # else it had no link left (its row and column are its own)
        out = out + np.outer(w[kept, lost], w[lost, kept]) / passes_on
    return out
