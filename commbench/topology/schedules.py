"""Dynamic schedules: which mixing matrix applies at each training step — a static
topology every step, Bluefog's one-peer schedule over it, or Bluefog's inner-outer
schedule for ranks on several machines."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from commbench.config.flags import flag
from commbench.config.sections import Section
from commbench.topology.graphs import (DEFAULT_TOPOLOGY, FAMILIES, Topology, TopologyError,
                                       build_topology, parse_name, positive)


@dataclass(frozen=True)
class TopologyFlags(Section):
    title = "topology (strategies that average along a graph)"
    ignored_because = ("averages along no topology; leave it out (`commbench list` names "
                       "the strategies that have one)")

    topology: str = flag(DEFAULT_TOPOLOGY, "topology of decentralized strategies "
                         "(see `commbench list`)", metavar="NAME")
    disable_dynamic_topology: bool = flag(False, "use the static topology every step "
                                          "instead of the dynamic one-peer schedule")
    atc_style: bool = flag(False, "adapt-then-combine (x' = W(x - lr g)) instead of "
                           "adapt-with-combine (x' = Wx - lr g)")


class Schedule:
    """The mixing matrix at each training step t = 0, 1, 2, ...; it repeats every `period` steps.

    kind is "static" (the same topology every step), "one-peer" (each worker sends
    to one out-neighbor per step) or "inner-outer" (Bluefog's multi-machine schedule).
    """

    def __init__(self, name: str, size: int, kind: str, period: int,
                 build: Callable[[int], np.ndarray]) -> None:
        self.name, self.size, self.kind, self.period = name, size, kind, period
        # Bounded: fully-connected one-peer on n workers has n-1 dense n x n phases.
        self._at = functools.lru_cache(maxsize=64)(lambda phase: Topology(name, build(phase)))

    @property
    def dynamic(self) -> bool:
        return self.kind != "static"

    def at(self, step: int) -> Topology:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self._at(step % self.period)

    def __repr__(self) -> str:
        return (f"Schedule({self.name!r}, size={self.size}, kind={self.kind!r}, "
                f"period={self.period})")


def _one_peer(static: Topology) -> Schedule:
    """Bluefog's GetDynamicOnePeerSendRecvRanks, with its weights.

    At step t worker i sends only to the (t mod out-degree)-th of its out-neighbors,
    taken clockwise (sorted by (j - i) mod n); a worker averages itself and
    everyone who sent to it with equal weights. On a circulant graph every worker
    receives exactly one value (weights 1/2); for exponential-2 on n = 2^m, m
    consecutive steps multiply to the exact average 11^T/n.
    """
    n = static.size
    targets = [sorted(static.out_neighbors(i), key=lambda j, i=i: (j - i) % n) for i in range(n)]
    period = math.lcm(*(len(t) for t in targets if t)) if n > 1 else 1

    def build(phase: int) -> np.ndarray:
        sent = np.zeros((n, n))
        for src, dsts in enumerate(targets):
            if dsts:  # n = 1 has nobody to talk to
                sent[dsts[phase % len(dsts)], src] = 1.0
        weights = sent + np.eye(n)
        return weights / weights.sum(axis=1, keepdims=True)

    return Schedule(static.name, n, "one-peer", period, build)


def _inner_outer(machines: int, local: int) -> Schedule:
    """Bluefog's GetInnerOuterExpo2DynamicSendRecvRanks (machines >= 2, local >= 3).

    Rank r = m * local + l. At step t local rank o = t mod local of every machine
    receives from the same local rank of machine m - 2^(t mod (floor(log2(M-1)) + 1));
    the other local - 1 ranks form a ring that skips o and receive from 2^(t mod
    (floor(log2(local-2)) + 1)) places back on it. Every rank averages 1/2 with
    its one source, so each step is a permutation averaged with I.
    """
    n = machines * local
    out_levels = (machines - 1).bit_length()  # floor(log2(M - 1)) + 1
    in_levels = (local - 2).bit_length()  # floor(log2(L - 2)) + 1
    machine, lrank = np.divmod(np.arange(n), local)

    def build(phase: int) -> np.ndarray:
        outside = phase % local
        hop, inner_hop = 1 << (phase % out_levels), 1 << (phase % in_levels)
        ring_pos = (lrank - outside - 1) % local  # 0 .. local-2 on the ring skipping o
        inner_src = (outside + 1 + (ring_pos - inner_hop) % (local - 1)) % local
        src = np.where(lrank == outside,
                       ((machine - hop) % machines) * local + lrank,
                       machine * local + inner_src)
        return 0.5 * (np.eye(n) + np.eye(n)[src])

    return Schedule(DEFAULT_TOPOLOGY, n, "inner-outer",
                    math.lcm(local, out_levels, in_levels), build)


def build_schedule(name: str, size: int, dynamic: bool,
                   machine_size: Optional[int] = None) -> Schedule:
    """The mixing matrices per step for `--topology name` on `size` workers.

    dynamic=False: `name` every step. dynamic=True: the one-peer schedule over
    `name`, except that exponential-2 over several machines of `machine_size`
    ranks each uses Bluefog's inner-outer schedule, as Bluefog's benchmark does
    when size > local_size. For hierarchical neighbor allreduce, where machines
    are the nodes, call build_schedule("exponential-2", num_machines, dynamic).

    Where this departs from Bluefog: Bluefog refuses machine_size <= 2 for the
    inner-outer schedule; we use the one-peer schedule there instead (identical
    for machine_size 1; for 2 the inner-outer rule never mixes a machine's two
    ranks, so the graph would stay disconnected). Other topologies keep their own
    one-peer schedule on several machines rather than being swapped for exponential-2.
    """
    static = build_topology(name, size)
    n = static.size
    if machine_size is not None:
        local = positive(machine_size, "ranks per machine")
        if n % local:
            raise TopologyError(
                f"ranks per machine ({local}) must divide the number of workers ({n})"
            )
    if not dynamic:
        return Schedule(name, n, "static", 1, lambda phase: static.weights)
    family, _ = parse_name(name)
    if not FAMILIES[family][1]:
        raise TopologyError(
            f"topology {name!r} has no dynamic schedule; pass --disable-dynamic-topology"
        )
    if name == DEFAULT_TOPOLOGY and machine_size is not None and 3 <= machine_size < n:
        return _inner_outer(n // machine_size, machine_size)
    return _one_peer(static)
