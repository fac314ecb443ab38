"""Every number commbench reports, defined once (the "Metrics" section of docs/run.md
documents the same definitions).

Per iteration i and worker r: throughput r_i = batch × batches_per_iter / t_i,
t_i being wall-clock time with a device sync at the end.
Total per iteration: S_i = Σ_r r_i, summed over the samples gathered from every rank.
Reported as mean(S) ± 1.96·std(S), the spread of iterations as Horovod and Bluefog
print it, and as mean(S) with a real 95% confidence interval of the mean
(Student's t, n − 1 degrees of freedom).
Latency: p50/p75/p90 of seconds per batch, pooled over ranks.
In-job scaling efficiency: E* = mean(S) / mean(C), C_j = Σ_r c_rj being the workers'
compute-only throughput in reference iteration j, measured in the same job with no
communication by all workers at once (they start together after a barrier, half of
the reference before the run and half after it, each half at least
--reference-seconds long), so they compete for the machine as in the run; its 95%
CI by the delta method on the ratio of the two means.
Scaling efficiency across jobs: E(N) = Total(N) / (N · Total(1)), Total(1) from the
same strategy's 1-worker runs (else the compute-only `none`'s), with its CI likewise.
Communication overhead: 1 − compute-only time per batch / step time per batch (CI
likewise).
Numbers not to be trusted are flagged (trust_flags): an efficiency above 100%, a
negative overhead, a CI wider than 10% of its mean, workers on a machine beyond its
physical cores, reference windows that did not overlap or drifted.
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

SPREAD_Z = 1.96  # Horovod's and Bluefog's "+-": 1.96 standard deviations of the iterations
PERCENTILES = (50, 75, 90)


def spread(values: Sequence[float]) -> float:
    """1.96 × population std of the samples, exactly as Horovod prints it."""
    return SPREAD_Z * float(np.std(values))


def load_statistics() -> None:
    """Import what the intervals and tests below need (scipy's statistics), ahead of
    the moment they are needed."""
    from scipy import stats  # noqa: F401


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


# Each unit a speed run counts (its summary's `unit`): the throughput's name and one
# item's. Results written before language models have no unit: they counted images.
UNITS = {"images": ("img/sec", "image"), "tokens": ("tokens/sec", "token")}


def rate_name(summary: Dict[str, Any]) -> str:
    """"img/sec" or "tokens/sec": the name of the run's throughput, in its unit."""
    return UNITS[summary.get("unit") or "images"][0]


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


def ratio_ci95(ratio: float, a_mean: float, a_ci: Optional[float], b_mean: float,
               b_ci: Optional[float]) -> Optional[float]:
    """Half-width of the 95% CI of a ratio of two independent means from their own
    half-widths (delta method); None when either is unknown."""
    if a_ci is None or b_ci is None or not a_mean or not b_mean:
        return None
    return abs(ratio) * math.hypot(a_ci / a_mean, b_ci / b_mean)


def ratio_of_means(a: Sequence[float], b: Sequence[float]) -> Tuple[float, Optional[float]]:
    """mean(a) / mean(b) and the half-width of its 95% CI."""
    a_mean, b_mean = float(np.mean(a)), float(np.mean(b))
    ratio = a_mean / b_mean
    return ratio, ratio_ci95(ratio, a_mean, ci95_halfwidth(a), b_mean, ci95_halfwidth(b))


def overlap(windows: Sequence[Sequence[float]]) -> float:
    """How much of the shortest of the ranks' [start, end] windows all of them share:
    1 when they ran together, 0 or less when one started after another ended."""
    starts, ends = [w[0] for w in windows], [w[1] for w in windows]
    shortest = min(e - s for s, e in zip(starts, ends))
    return (min(ends) - max(starts)) / shortest if shortest > 0 else 0.0


def summarize(batch_size: int, batches_per_iter: int, iteration_seconds, batch_seconds,
              reference_seconds=None, reference_windows=None) -> Dict[str, object]:
    """The summary of one run from the samples of all ranks.

    iteration_seconds: [ranks, iterations]; batch_seconds: [ranks, iterations, batches];
    reference_seconds: [ranks, iterations] of the compute-only reference, or None;
    reference_windows: [ranks, halves, (start, end)] of its halves (wall-clock), or None.
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
        summary.update(_in_job(images, workers, total, iteration_seconds, reference_seconds,
                               reference_windows))
    return summary


def _in_job(images: int, workers: int, total, iteration_seconds, reference_seconds,
            windows) -> Dict[str, object]:
    compute = total_throughput(images, reference_seconds)  # C_j
    efficiency, efficiency_ci = ratio_of_means(total, compute)
    # Times per iteration, averaged over ranks: compute-only over step.
    share, share_ci = ratio_of_means(np.mean(reference_seconds, axis=0),
                                     np.mean(iteration_seconds, axis=0))
    found: Dict[str, object] = {
        "compute_only_img_sec_per_worker": float(compute.mean() / workers),
        "efficiency_in_job": efficiency, "efficiency_in_job_ci95": efficiency_ci,
        "communication_overhead": 1.0 - share, "communication_overhead_ci95": share_ci,
    }
    if windows:
        halves = len(windows[0])
        found["reference_overlap"] = min(overlap([rank[h] for rank in windows])
                                         for h in range(halves))
        if halves == 2 and compute.size >= 2:
            before, after = np.array_split(compute, 2)
            found["reference_drift"] = float(after.mean() / before.mean() - 1.0)
    return found


# --- what not to trust ---------------------------------------------------------------

NOISY = 0.10  # a 95% CI wider than this fraction of its mean does not rank anything
LATE = 0.5  # reference windows sharing less than this are not "at the same time"
DRIFT = 0.10  # compute-only rates before and after the run differing more than this

REMEDY = "run longer (--num-iters, --num-batches-per-iter) or repeat (sweep --repeat K)"
FLAGS = {
    "oversubscribed": "more workers on a machine than physical cores: the point measures "
                      "CPU sharing, not communication",
    "noisy": f"95% CI wider than {NOISY:.0%} of the mean: {REMEDY}",
    "E*>100%": "in-job efficiency above 100% is impossible: the reference was measured "
               f"too short or not at the same time as the run; {REMEDY}",
    "E(N)>100%": "efficiency above 100% against the 1-worker run: noise, or the 1-worker "
                 f"run was slowed (e.g. threads); {REMEDY}",
    "comm<0": f"negative communication overhead is impossible: {REMEDY}",
    "reference": "the workers' compute-only reference windows did not overlap, or the "
                 "reference drifted between before and after the run: E* and comm are "
                 "not comparable",
    # not one of trust_flags': the readers set it from summary.diverged, which the run
    # prints in a line of its own
    "diverged": "the training loss became NaN or infinite (where: below the table): the "
                "img/sec stand, the loss and the consensus distance do not",
}


def trust_flags(summary: Dict[str, object], efficiency: Optional[float] = None
                ) -> List[str]:
    """The FLAGS codes that apply to a run's (or a combined point's) summary;
    efficiency: its E(N), where known."""
    found = []
    if summary.get("oversubscribed"):
        found.append("oversubscribed")
    total = summary.get("total_img_sec") or {}
    ci, mean = total.get("ci95"), total.get("mean")
    if ci is None or (mean and ci > NOISY * mean):
        found.append("noisy")
    if (summary.get("efficiency_in_job") or 0) > 1.0:
        found.append("E*>100%")
    if efficiency is not None and efficiency > 1.0:
        found.append("E(N)>100%")
    overhead = summary.get("communication_overhead")
    if overhead is not None and overhead < 0:
        found.append("comm<0")
    overlap_ = summary.get("reference_overlap")
    drift = summary.get("reference_drift")
    if (overlap_ is not None and overlap_ < LATE) or (drift is not None and abs(drift) > DRIFT):
        found.append("reference")
    return found


# --- microbenchmarks (commbench microbench) -----------------------------------------

MICRO_PERCENTILES = (50, 99)


def call_time_stats(seconds) -> Dict[str, float]:
    """Mean, p50 and p99 of per-call seconds, pooled over ranks and calls."""
    values = np.ravel(np.asarray(seconds, dtype=float))
    summary = {"mean": float(values.mean())}
    summary.update({f"p{p}": float(np.percentile(values, p)) for p in MICRO_PERCENTILES})
    return summary


def paired_ratio(ours, theirs) -> float:
    """Median over ranks and calls of our time over theirs in the same call, from two
    [rank][call] arrays of seconds. Interleaved calls with the same index ran the same
    step of a schedule (one-peer alternates steps of different kinds) under the same
    load, so each pair compares like with like where a ratio of pooled medians may not."""
    return float(np.median(np.asarray(ours, dtype=float) / np.asarray(theirs, dtype=float)))


def paired_interval(ratios: Sequence[float]) -> Tuple[float, float]:
    """95% CI of the geometric mean of paired ratios (Student's t on the log ratios):
    each pair ran under the same conditions (a round of an A/B run, or a seed that both
    strategies trained on), so what differs between pairs cancels out of each ratio."""
    logs = np.log(np.asarray(ratios, dtype=float))
    if logs.size < 2:
        return float(ratios[0]), float(ratios[0])
    from scipy import stats

    half = stats.t.ppf(0.975, logs.size - 1) * logs.std(ddof=1) / math.sqrt(logs.size)
    return float(math.exp(logs.mean() - half)), float(math.exp(logs.mean() + half))


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the buffer's size over the time of one call."""
    return nbytes / seconds


def allreduce_bus_factor(n: int) -> float:
    """busbw / algbw for allreduce: 2(n − 1)/n (nccl-tests); 0 for one rank (no traffic)."""
    return 2.0 * (n - 1) / n


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring allreduce of nbytes: 2(n − 1)/n·S."""
    return allreduce_bus_factor(n) * nbytes
