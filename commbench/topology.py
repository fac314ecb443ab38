"""Who averages with whom: the mixing matrices behind decentralized strategies.

`neighbor_allreduce` and `hierarchical_neighbor_allreduce` replace each worker's
parameters by a weighted average of its own and its in-neighbors'. This module
builds those weights, as static graphs (`build_topology`) and as per-step dynamic
schedules (`build_schedule`), and says how fast each one mixes (`spectral_gap`).

Convention: W[i, j] is the weight receiver i gives to worker j's value, so one
averaging step is x' = W @ x. Row i off the diagonal lists i's in-neighbors,
column j lists j's out-neighbors. Bluefog's networkx graphs store the transpose
(edge j -> i carries W[i, j]). In a circulant graph with shift set S, worker i
receives from i - k and sends to i + k (mod n) for every k in S.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

import numpy as np

from commbench.errors import UsageError

DEFAULT_TOPOLOGY = "exponential-2"


class TopologyError(UsageError, ValueError):
    """A topology that cannot be built; the message is one line, shown to the user as is."""


@dataclass(frozen=True, eq=False)
class Topology:
    """A mixing matrix W (n x n, float64, read-only) and the graph it defines."""

    name: str
    weights: np.ndarray

    def __post_init__(self) -> None:
        # A private read-only copy: a Topology is shared between steps and ranks,
        # and frozen=True alone does not stop writes into the array.
        w = np.array(self.weights, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] != w.shape[1]:
            raise ValueError(f"mixing matrix must be square, got shape {w.shape}")
        w.setflags(write=False)
        object.__setattr__(self, "weights", w)

    @property
    def size(self) -> int:
        return self.weights.shape[0]

    def in_neighbors(self, rank: int) -> Dict[int, float]:
        """Source rank -> weight this rank gives its value; self excluded, sorted by rank."""
        row = self.weights[self._check(rank)]
        return {int(j): float(row[j]) for j in np.flatnonzero(row) if j != rank}

    def out_neighbors(self, rank: int) -> Dict[int, float]:
        """Destination rank -> weight it gives this rank's value; self excluded, sorted by rank."""
        col = self.weights[:, self._check(rank)]
        return {int(i): float(col[i]) for i in np.flatnonzero(col) if i != rank}

    def self_weight(self, rank: int) -> float:
        return float(self.weights[self._check(rank), rank])

    def is_doubly_stochastic(self, atol: float = 1e-12) -> bool:
        """Rows and columns sum to one: the average is kept and consensus is on it."""
        w = self.weights
        return bool(
            (w >= 0).all()
            and np.allclose(w.sum(axis=0), 1.0, rtol=0, atol=atol)
            and np.allclose(w.sum(axis=1), 1.0, rtol=0, atol=atol)
        )

    @functools.cached_property
    def spectral_gap(self) -> float:
        """1 - (second largest singular value of W); 1.0 for a single worker.

        For doubly stochastic W this is 1 - ||W - 11^T/n||, the factor by which one
        step at least shrinks the distance to consensus: 1 is exact averaging,
        near 0 is slow mixing.
        """
        if self.size == 1:
            return 1.0
        return float(1.0 - np.linalg.svd(self.weights, compute_uv=False)[1])

    def _check(self, rank: int) -> int:
        if not 0 <= rank < self.size:
            raise IndexError(f"rank {rank} out of range for {self.size} workers")
        return rank


# --- static graphs -----------------------------------------------------------


def _powers_below(n: int, base: int) -> List[int]:
    # Integer arithmetic on purpose: Bluefog's isPowerOf uses math.log and
    # misses 243 = 3**5 (log(243, 3) = 4.999...).
    powers, p = [], 1
    while p < n:
        powers.append(p)
        p *= base
    return powers


def _circulant(n: int, shifts: Iterable[int]) -> np.ndarray:
    """Uniform weights 1/(in-degree + 1) for self and each i - k, k in shifts."""
    unique = {k % n for k in shifts} - {0}  # ring on n = 2: shifts 1 and n-1 coincide
    w = 1.0 / (len(unique) + 1)
    weights = np.eye(n) * w
    ranks = np.arange(n)
    for k in unique:
        weights[ranks, (ranks - k) % n] = w
    return weights


def _symmetric_exponential(n: int, base: int) -> np.ndarray:
    # Bluefog's SymmetricExponentialGraph: index = i if i <= n//2 else n - i,
    # which is min(i, n - i) for every i.
    powers = set(_powers_below(n, base))
    return _circulant(n, [k for k in range(1, n) if min(k, n - k) in powers])


def mesh_shape(n: int) -> Tuple[int, int]:
    """(rows, cols) of the 2-D mesh: rows is the largest divisor of n not above sqrt(n)."""
    rows = math.isqrt(n)
    while n % rows:
        rows -= 1
    return rows, n // rows


def _mesh_2d(n: int) -> np.ndarray:
    """Bluefog's MeshGrid2DGraph: row-major grid, links right and down, no wrap-around."""
    _, cols = mesh_shape(n)
    linked = np.zeros((n, n), dtype=bool)
    for i in range(n):
        if (i + 1) % cols:
            linked[i, i + 1] = linked[i + 1, i] = True
        if i + cols < n:
            linked[i, i + cols] = linked[i + cols, i] = True
    # Metropolis-Hastings: symmetric, hence doubly stochastic, whatever the degrees.
    degree = linked.sum(axis=1) + 1  # counts self, as Bluefog does
    weights = np.where(linked, 1.0 / np.maximum.outer(degree, degree), 0.0)
    weights[np.diag_indices(n)] = 1.0 - weights.sum(axis=1)
    return weights


def _star(n: int) -> np.ndarray:
    """Bluefog's StarGraph: leaves keep 1 - 1/n and take 1/n of the center; the
    center takes 1/n of everyone (itself included). Symmetric, so doubly stochastic."""
    weights = np.eye(n) * (1.0 - 1.0 / n)
    weights[0, :] = weights[:, 0] = 1.0 / n
    return weights


class TopologyInfo(NamedTuple):
    name: str
    description: str
    has_dynamic: bool


# family -> (build(n, base), dynamic schedule allowed); <b> families take a base.
_FAMILIES: Dict[str, Tuple[Callable[[int, int], np.ndarray], bool]] = {
    "exponential": (lambda n, b: _circulant(n, _powers_below(n, b)), True),
    "symmetric-exponential": (_symmetric_exponential, True),
    "ring": (lambda n, _: _circulant(n, (1, n - 1)), True),
    # Left/right as in Bluefog's RingGraph: ring-left sends to i-1 (receives from i+1).
    "ring-left": (lambda n, _: _circulant(n, (n - 1,)), True),
    "ring-right": (lambda n, _: _circulant(n, (1,)), True),
    "mesh-2d": (lambda n, _: _mesh_2d(n), False),
    "star": (lambda n, _: _star(n), False),
    "fully-connected": (lambda n, _: np.full((n, n), 1.0 / n), True),
}

_CATALOG = (
    TopologyInfo("exponential-2", "i receives from i - 2^k for 2^k < n; uniform weights (default)", True),
    TopologyInfo("exponential-<b>", "i receives from i - b^k for b^k < n, integer base b >= 2", True),
    TopologyInfo("symmetric-exponential", "undirected: shifts k with min(k, n-k) a power of 4", True),
    TopologyInfo("symmetric-exponential-<b>", "the same with base b >= 2", True),
    TopologyInfo("ring", "i averages with i-1 and i+1, weights 1/3", True),
    TopologyInfo("ring-left", "one-directional ring: i sends to i-1, weights 1/2", True),
    TopologyInfo("ring-right", "one-directional ring: i sends to i+1, weights 1/2", True),
    TopologyInfo("mesh-2d", "2-D grid without wrap-around, Metropolis-Hastings weights", False),
    TopologyInfo("star", "every worker averages with worker 0", False),
    TopologyInfo("fully-connected", "everyone averages with everyone, weights 1/n", True),
)
TOPOLOGY_NAMES = tuple(info.name for info in _CATALOG)


def describe() -> List[TopologyInfo]:
    """(name, one-line description, has a dynamic schedule) for `commbench list`."""
    return list(_CATALOG)


def _parse(name: str) -> Tuple[str, int]:
    """Family and base (0 where there is none) of a topology name."""
    based = re.fullmatch(r"((?:symmetric-)?exponential)(?:-(.*))?", name)
    if based:
        family, base = based.groups()
        if base is None and family == "symmetric-exponential":
            return family, 4
        if base is not None:
            if not re.fullmatch(r"[0-9]+", base) or int(base) < 2:
                raise TopologyError(
                    f"topology {name!r}: the base must be an integer >= 2 (e.g. {family}-2)"
                )
            return family, int(base)
    elif name in _FAMILIES:
        return name, 0
    raise TopologyError(f"unknown topology {name!r}; accepted: {', '.join(TOPOLOGY_NAMES)}")


def _positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise TopologyError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def build_topology(name: str, size: int) -> Topology:
    """The static topology `name` on `size` workers."""
    n = _positive(size, "number of workers")
    family, base = _parse(name)
    build, _ = _FAMILIES[family]
    return Topology(name, build(n, base))


# --- dynamic schedules -------------------------------------------------------


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
        return f"Schedule({self.name!r}, size={self.size}, kind={self.kind!r}, period={self.period})"


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
        local = _positive(machine_size, "ranks per machine")
        if n % local:
            raise TopologyError(
                f"ranks per machine ({local}) must divide the number of workers ({n})"
            )
    if not dynamic:
        return Schedule(name, n, "static", 1, lambda phase: static.weights)
    family, _ = _parse(name)
    if not _FAMILIES[family][1]:
        raise TopologyError(
            f"topology {name!r} has no dynamic schedule; pass --disable-dynamic-topology"
        )
    if name == DEFAULT_TOPOLOGY and machine_size is not None and 3 <= machine_size < n:
        return _inner_outer(n // machine_size, machine_size)
    return _one_peer(static)
