"""Every number commbench reports, defined once (the README's "Metrics" section
documents the same definitions).

Per iteration i and worker r: throughput r_i = batch × batches_per_iter / t_i,
t_i being wall-clock time with a device sync at the end.
Total per iteration: S_i = Σ_r r_i, summed over the samples gathered from every rank.
Reported as mean(S) ± 1.96·std(S), the spread of iterations as Horovod and Bluefog
print it, and as mean(S) with a real 95% confidence interval of the mean
(Student's t, n − 1 degrees of freedom).
Latency: p50/p75/p90 of seconds per batch, pooled over ranks.
In-job scaling efficiency: E* = mean(S) / Σ_r c_r, c_r being worker r's
compute-only throughput measured in the same job with no communication (so the
workers compete for the machine exactly as in the run).
Scaling efficiency across jobs: E(N) = Total(N) / (N · Total(1)).
Communication overhead: 1 − compute-only time per batch / step time per batch.
Consensus distance: mean over workers of ‖x_r − x̄‖² / ‖x̄‖².
Repeated runs of one configuration: the mean of the runs' means, with the 95%
confidence interval over those run means (runs differ more than iterations do).
A/B comparison: Welch's t-test on the two arms' per-iteration totals S_i.
Microbenchmarks (`commbench microbench`, size sweeps of S bytes per rank): time per
call pooled over ranks and calls (mean, p50, p99); algbw = S / mean time; for
allreduce busbw = algbw × 2(n − 1)/n (nccl-tests' definition, see its
doc/PERFORMANCE.md), the ring algorithm's 2(n − 1)/n·S bytes sent and received per
rank; for neighbor exchange the bytes each rank sends (out-degree × S) and receives
(in-degree × S) per call, and the per-link bandwidth S / mean time (links run
concurrently, each carries S). Ratio to a raw primitive: p50 time / its p50 time.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import numpy as np

SPREAD_Z = 1.96  # Horovod's and Bluefog's "+-": 1.96 standard deviations of the iterations
PERCENTILES = (50, 75, 90)


def spread(values: Sequence[float]) -> float:
    """1.96 × population std of the samples, exactly as Horovod prints it."""
    return SPREAD_Z * float(np.std(values))


def ci95_halfwidth(values: Sequence[float]) -> Optional[float]:
    """Half-width of the 95% confidence interval of the mean; None below 2 samples."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return None
    from scipy import stats

    return float(stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))


def describe(values: Sequence[float]) -> Dict[str, Optional[float]]:
    return {"mean": float(np.mean(values)), "spread": spread(values),
            "ci95": ci95_halfwidth(values), "n": len(values)}


def percentiles(values: Sequence[float]) -> Dict[str, float]:
    return {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}


def throughputs(images_per_iteration: int, iteration_seconds) -> np.ndarray:
    """Per-rank, per-iteration img/sec from a [ranks, iterations] array of seconds."""
    return images_per_iteration / np.asarray(iteration_seconds, dtype=float)


def total_throughput(images_per_iteration: int, iteration_seconds) -> np.ndarray:
    """S_i = Σ_r r_i: the whole job's img/sec in each iteration, from [ranks, iterations]."""
    return throughputs(images_per_iteration, iteration_seconds).sum(axis=0)


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """Two-sided p-value of Welch's t-test (unequal variances) that samples a and b
    have the same mean; None when either has fewer than 2 samples.

    Welch rather than Mann-Whitney: benchmarks often have only a few iterations, and
    Mann-Whitney cannot reach p < 0.05 with 3 samples a side however large the change.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return None
    if a.std() == 0 and b.std() == 0:  # the t statistic is undefined; the answer is not
        return 1.0 if a.mean() == b.mean() else 0.0
    from scipy import stats

    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def scaling_efficiency(total: float, workers: int, single_worker_total: float) -> float:
    """E(N) = Total(N) / (N · Total(1))."""
    return total / (workers * single_worker_total)


def summarize(batch_size: int, batches_per_iter: int, iteration_seconds, batch_seconds,
              reference_seconds=None) -> Dict[str, object]:
    """The summary of one run from the samples of all ranks.

    iteration_seconds: [ranks, iterations]; batch_seconds: [ranks, iterations, batches];
    reference_seconds: [ranks, iterations] of the compute-only reference, or None.
    """
    images = batch_size * batches_per_iter
    workers = np.shape(iteration_seconds)[0]
    total = total_throughput(images, iteration_seconds)
    summary: Dict[str, object] = {
        "workers": workers,
        "total_img_sec": describe(total),
        "img_sec_per_worker": describe(total / workers),
        "latency_seconds_per_batch": percentiles(np.ravel(batch_seconds)),
    }
    if reference_seconds is not None and np.size(reference_seconds):
        compute_rates = throughputs(images, reference_seconds).mean(axis=1)  # c_r per rank
        summary["compute_only_img_sec_per_worker"] = float(compute_rates.mean())
        summary["efficiency_in_job"] = float(total.mean() / compute_rates.sum())
        step = float(np.mean(iteration_seconds)) / batches_per_iter
        compute = float(np.mean(reference_seconds)) / batches_per_iter
        summary["communication_overhead"] = 1.0 - compute / step
    return summary


# --- microbenchmarks (commbench microbench) -----------------------------------------

MICRO_PERCENTILES = (50, 99)


def call_time_stats(seconds) -> Dict[str, float]:
    """Mean, p50 and p99 of per-call seconds, pooled over ranks and calls."""
    values = np.ravel(np.asarray(seconds, dtype=float))
    stats = {"mean": float(values.mean())}
    stats.update({f"p{p}": float(np.percentile(values, p)) for p in MICRO_PERCENTILES})
    return stats


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the buffer's size over the time of one call."""
    return nbytes / seconds


def allreduce_bus_factor(n: int) -> float:
    """busbw / algbw for allreduce: 2(n − 1)/n (nccl-tests); 0 for one rank (no traffic)."""
    return 2.0 * (n - 1) / n


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring allreduce of nbytes: 2(n − 1)/n·S."""
    return allreduce_bus_factor(n) * nbytes
