"""The statistics every A/B contender reports: the ratio of two arms measured in paired
rounds (each round runs both, so drift between rounds hits both alike). Light: no
torch, so the contenders that launch whole jobs import it too."""

import statistics
from typing import Dict, List

# 95% CI of the geometric mean of paired ratios; the contenders import it from here
from commbench.result.metrics import paired_interval as interval


def ratio(rates: Dict[str, List[float]], ours: str, theirs: str) -> str:
    """ours/theirs two ways: the ratio of the two medians, and the median of the
    per-round ratios (the rounds alternate, so each round pairs the contenders under
    the same load; with drift between rounds the paired figure is the steadier)."""
    medians = statistics.median(rates[ours]) / statistics.median(rates[theirs])
    pairs = [a / b for a, b in zip(rates[ours], rates[theirs])]
    low, high = interval(pairs)
    return (f"{medians:.3f} (ratio of medians), {statistics.median(pairs):.3f} (median of "
            f"paired rounds; 95% CI of their geometric mean {low:.3f}..{high:.3f})")

