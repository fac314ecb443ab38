"""What torch's PowerSGD hook (`--compression powersgd:RANK`) sends per step, as its code
does it: in each of DDP's buckets, a gradient viewed as a matrix of its first dimension
by the rest is compressed when (rows + columns) x rank x min_rate < rows x columns (the
rank capped at the smaller side); the rest of the bucket is allreduced whole, then the
compressed ones' P factors (rows x rank each), then their Q factors (columns x rank),
three allreduces one after the other. Its codec (the orthogonalization and the products)
is not modelled from FLOPs: a projection takes it from the measured step split.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

from commbench.simulate.compute import ELEMENT_BYTES, Gradients


def split(shape: Sequence[int], rank: int, min_rate: float) -> Tuple[int, int, int]:
    """(elements sent whole, elements of P, elements of Q) of one gradient."""
    rows = shape[0] if shape else 1
    columns = math.prod(shape[1:]) if len(shape) > 1 else 1
    r = min(rows, columns, rank)
    if (rows + columns) * r * min_rate < rows * columns:
        return 0, rows * r, columns * r
    return rows * columns, 0, 0


def messages(grads: Gradients, rank: int, min_rate: float) -> List[Tuple[float, float]]:
    """(bytes, ready share of backward) of each allreduce the hook issues per step, in
    order: per bucket the whole ones, the Ps and the Qs (each only where it has any)."""
    found = []
    for bucket in grads.bucket_indices():
        parts = [split(grads.shapes[i], rank, min_rate) for i in bucket]
        ready = max(grads.ready[i] for i in bucket)
        for k in range(3):
            elements = sum(p[k] for p in parts)
            if elements:
                found.append((float(elements * ELEMENT_BYTES), ready))
    return found


def compression_rate(grads: Gradients, rank: int, min_rate: float) -> float:
    """Elements before over elements sent: what torch's compression_stats() reports."""
    before = sum(math.prod(shape) for shape in grads.shapes)
    after = sum(sum(split(shape, rank, min_rate)) for shape in grads.shapes)
    return before / after
