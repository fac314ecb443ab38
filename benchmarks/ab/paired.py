"""The statistics every A/B contender reports: the ratio of two arms measured in paired
rounds (each round runs both, so drift between rounds hits both alike). Light: no
torch, so the contenders that launch whole jobs import it too."""

import math
import statistics
from typing import Dict, List


def ratio(rates: Dict[str, List[float]], ours: str, theirs: str) -> str:
    """ours/theirs two ways: the ratio of the two medians, and the median of the
    per-round ratios (the rounds alternate, so each round pairs the contenders under
    the same load; with drift between rounds the paired figure is the steadier)."""
    medians = statistics.median(rates[ours]) / statistics.median(rates[theirs])
    pairs = [a / b for a, b in zip(rates[ours], rates[theirs])]
    low, high = interval(pairs)
    return (f"{medians:.3f} (ratio of medians), {statistics.median(pairs):.3f} (median of "
            f"paired rounds; 95% CI of their geometric mean {low:.3f}..{high:.3f})")


def interval(ratios: List[float]):
    """95% CI of the geometric mean of paired ratios (t on the log ratios)."""
    from scipy import stats

    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return ratios[0], ratios[0]
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.mean(logs)
    return math.exp(mean - half), math.exp(mean + half)
