"""Combining repeated runs' times to a target accuracy, where a run may not have reached
it: MLPerf Training's rule, the median and spread, and an exact rank test for `compare`.

A run that did not reach the target has no time. Where runs are ordered by time it
counts as slower than any run that did (MLPerf Training counts a failed run as an
infinite time), so it can be dropped as the slowest, or make a median "not reached",
but never gives a number.

MLPerf Training's rule (training_rules.adoc, "Benchmark Results"): drop the fastest and
the slowest run and take the mean of the rest; a single run that did not converge may
be treated as the slowest and dropped; with more than one the result is invalid.
Dropping both ends needs at least 3 runs; below that the median is used, flagged.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

NEVER = math.inf  # the time of a run that did not reach the target, for ordering only
OLYMPIC_MIN_RUNS = 3  # the fewest runs from which the fastest and the slowest can be dropped
EXACT_LIMIT = 200_000  # rank splits enumerated by the exact test; beyond: normal approximation

OLYMPIC, MEDIAN, INVALID = "olympic", "median", "invalid"


@dataclass(frozen=True)
class Combined:
    """A row's time: its value (None when there is none to give), the rule that made
    it and, in words, why it is what it is."""

    value: Optional[float]
    rule: str  # OLYMPIC, MEDIAN (too few runs for MLPerf's rule) or INVALID
    why: str

    def label(self) -> str:
        """The short name the tables print beside the time."""
        if self.rule == MEDIAN:
            return f"median (<{OLYMPIC_MIN_RUNS} runs)"
        return self.why if self.rule == INVALID else self.rule


def ordered(times: Sequence[Optional[float]]) -> List[float]:
    """The times sorted, a run without one (None) as NEVER."""
    return sorted(NEVER if t is None else float(t) for t in times)


def median(times: Sequence[Optional[float]]) -> Optional[float]:
    """The median, runs without a time counting as slower than all others; None when
    it falls on such a run (or between one and a time: half a run reached nothing)."""
    values = ordered(times)
    if not values:
        return None
    middle = len(values) // 2
    found = values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
    return None if math.isinf(found) else found


def spread(times: Sequence[Optional[float]]) -> Optional[tuple]:
    """(min, max) of the times that exist; None when no run has one."""
    known = [float(t) for t in times if t is not None]
    return (min(known), max(known)) if known else None


def combine(times: Sequence[Optional[float]]) -> Combined:
    """MLPerf Training's combination of repeated runs' times (None: not reached)."""
    missed = sum(t is None for t in times)
    if len(times) < OLYMPIC_MIN_RUNS:
        value = median(times)
        why = (f"too few runs for MLPerf's rule ({len(times)} < {OLYMPIC_MIN_RUNS}): "
               "the median instead")
        return Combined(value, MEDIAN, why if value is not None
                        else why + ", which is a run that did not reach the target")
    if missed > 1:
        return Combined(None, INVALID, f"invalid ({missed} missed)")
    kept = ordered(times)[1:-1]  # a single run that missed is the slowest: dropped here
    return Combined(sum(kept) / len(kept), OLYMPIC,
                    f"mean of {len(kept)} of {len(times)} runs, fastest and slowest dropped")


def smallest_p(n1: int, n2: int) -> float:
    """The smallest two-sided p-value an exact rank test of n1 against n2 runs can give:
    when it is not below alpha, no outcome could be called significant."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return min(1.0, 2 / math.comb(n1 + n2, n1))


def mann_whitney_p(a: Sequence[Optional[float]], b: Sequence[Optional[float]]) -> Optional[float]:
    """Two-sided p-value of the Mann-Whitney U test of a against b (None: not reached,
    ranked slowest). Exact (every split of the pooled ranks, ties as mid-ranks) while
    the splits number at most EXACT_LIMIT, else scipy's normal approximation. None
    when an arm is empty."""
    x, y = ordered(a), ordered(b)
    if not x or not y:
        return None
    if math.comb(len(x) + len(y), len(x)) > EXACT_LIMIT:
        from scipy import stats

        big = max([v for v in x + y if not math.isinf(v)], default=0.0) * 2 + 1
        finite = ([big if math.isinf(v) else v for v in x],
                  [big if math.isinf(v) else v for v in y])  # ties among the missed kept
        return float(stats.mannwhitneyu(*finite, alternative="two-sided",
                                        method="asymptotic").pvalue)
    ranks = mid_ranks(x + y)
    n1, total = len(x), len(x) + len(y)
    centre = n1 * (total + 1) / 2  # the expected rank sum of a under no difference
    observed = abs(sum(ranks[:n1]) - centre)
    extreme = count = 0
    for chosen in itertools.combinations(ranks, n1):
        count += 1
        extreme += abs(sum(chosen) - centre) >= observed - 1e-9
    return extreme / count


def mid_ranks(values: List[float]) -> List[float]:
    """1-based ranks, tied values sharing the mean of their ranks (infinities tie too)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
