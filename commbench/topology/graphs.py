"""Topology families: the static mixing matrices behind decentralized strategies
(exponential, symmetric exponential, rings, 2-D mesh, star, fully connected), built
by name for a number of workers, and how fast each mixes (`spectral_gap`). The
conventions are the package's (commbench.topology)."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, NamedTuple, Tuple

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
FAMILIES: Dict[str, Tuple[Callable[[int, int], np.ndarray], bool]] = {
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
    TopologyInfo("exponential-2",
                 "i receives from i - 2^k for 2^k < n; uniform weights (default)", True),
    TopologyInfo("exponential-<b>",
                 "i receives from i - b^k for b^k < n, integer base b >= 2", True),
    TopologyInfo("symmetric-exponential",
                 "undirected: shifts k with min(k, n-k) a power of 4", True),
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


def parse_name(name: str) -> Tuple[str, int]:
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
    elif name in FAMILIES:
        return name, 0
    raise TopologyError(f"unknown topology {name!r}; accepted: {', '.join(TOPOLOGY_NAMES)}")


def positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise TopologyError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def build_topology(name: str, size: int) -> Topology:
    """The static topology `name` on `size` workers."""
    n = positive(size, "number of workers")
    family, base = parse_name(name)
    build, _ = FAMILIES[family]
    return Topology(name, build(n, base))
