"""Interval arithmetic on small sorted lists of (start, end) pairs: the union of
spans, its length, the overlap of two unions, what of one lies outside another and
what lies inside both.
The step split (commbench.timing.step_split) and the GPU's view of a step
(commbench.timing.gpu_kernels) are built from these."""

from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

Interval = Tuple[float, float]  # (start, end)


def union(spans: Iterable[Interval]) -> List[Interval]:
    merged: List[Interval] = []
    for start, end in sorted((start, end) for start, end in spans if end > start):
        if merged:
            first, last = merged[-1]
            if start <= last:
                merged[-1] = (first, max(last, end))
                continue
        merged.append((start, end))
    return merged


def length(spans: Sequence[Interval]) -> float:
    return sum(end - start for start, end in spans)


def overlap(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Length of the intersection of two unions."""
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def minus(a: Sequence[Interval], b: Sequence[Interval]) -> List[Interval]:
    """The parts of union a outside union b."""
    out = []
    for start, end in a:
        cursor = start
        for s, e in b:
            if e <= cursor or s >= end:
                continue
            if s > cursor:
                out.append((cursor, s))
            cursor = max(cursor, e)
        if cursor < end:
            out.append((cursor, end))
    return out


def inside(a: Sequence[Interval], b: Sequence[Interval]) -> List[Interval]:
    """The parts of union a inside union b."""
    return minus(a, minus(a, b))
