"""Statistics on samples whose answers are known."""

import math

import numpy as np
import pytest

from commbench.result import metrics


def test_spread_is_horovods_1_96_population_std():
    assert metrics.spread([1.0, 3.0]) == pytest.approx(1.96 * 1.0)


def test_ci95_is_student_t_of_the_mean():
    # n = 4, sample std 1.2909944, t(0.975, 3) = 3.182446
    values = [10.0, 11.0, 12.0, 13.0]
    assert metrics.ci95_halfwidth(values) == pytest.approx(3.182446 * 1.2909944 / 2, rel=1e-6)
    assert metrics.ci95_halfwidth([5.0]) is None


def test_percentiles_on_known_samples():
    assert metrics.percentiles(list(range(1, 101))) == pytest.approx(
        {"p50": 50.5, "p75": 75.25, "p90": 90.1})


def test_a_paired_ratio_compares_each_call_with_the_same_call():
    # Call 1 of both contenders ran a dear step of the schedule, calls 0 and 2 cheap
    # ones: call by call ours took half the time, though its pooled median is twice theirs.
    ours, theirs = [[1.0, 10.0, 10.0]], [[2.0, 20.0, 5.0]]
    assert metrics.paired_ratio(ours, theirs) == 0.5
    assert np.median(ours) / np.median(theirs) == 2.0
    assert metrics.paired_ratio([[1.0, 3.0], [2.0, 2.0]], [[1.0, 1.0], [2.0, 1.0]]) == 1.5


def test_paired_ratios_give_the_t_interval_of_their_geometric_mean():
    # log ratios -d, 0, +d: mean 0, sd d, so the interval is exp(+-t(0.975, 2) d / sqrt 3)
    d = 0.1
    low, high = metrics.paired_interval([math.exp(-d), 1.0, math.exp(d)])
    half = 4.302652729911275 * d / math.sqrt(3)
    assert (low, high) == pytest.approx((math.exp(-half), math.exp(half)))
    assert metrics.paired_interval([1.5]) == (1.5, 1.5)  # one pair: no spread to give


def test_summary_totals_are_sums_over_ranks_not_rank0_times_n():
    # Two ranks, two iterations, batch 4 x 2 batches = 8 images per iteration.
    iteration_seconds = [[1.0, 2.0], [0.5, 1.0]]
    batch_seconds = [[[0.5, 0.5], [1.0, 1.0]], [[0.25, 0.25], [0.5, 0.5]]]
    s = metrics.summarize(4, 2, iteration_seconds, batch_seconds)
    totals = [8 / 1.0 + 8 / 0.5, 8 / 2.0 + 8 / 1.0]  # 24, 12
    assert s["workers"] == 2
    assert s["total_img_sec"]["mean"] == pytest.approx(18.0)
    assert s["total_img_sec"]["spread"] == pytest.approx(1.96 * np.std(totals))
    assert s["img_sec_per_worker"]["mean"] == pytest.approx(9.0)
    assert s["latency_seconds_per_batch"]["p50"] == pytest.approx(0.5)
    assert "efficiency_in_job" not in s


def test_in_job_efficiency_and_overhead_from_the_compute_only_reference():
    iteration_seconds = [[2.0, 2.0], [2.0, 2.0]]  # 4 img/s per rank with communication
    reference = [[1.0], [1.0]]  # 8 img/s per rank without
    s = metrics.summarize(4, 2, iteration_seconds, [[[1, 1]] * 2] * 2, reference)
    assert s["compute_only_img_sec_per_worker"] == pytest.approx(8.0)
    assert s["efficiency_in_job"] == pytest.approx(8.0 / 16.0)
    assert s["communication_overhead"] == pytest.approx(0.5)


def test_scaling_efficiency_across_jobs():
    assert metrics.scaling_efficiency(300.0, 4, 100.0) == pytest.approx(0.75)
    assert not math.isnan(metrics.describe([1.0])["mean"])


@pytest.mark.job
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("command", [[], ["microbench", "--op", "allreduce"]])
def test_a_job_loads_its_statistics_before_it_starts(tmp_path, command, rank):
    """What a job's summary needs from scipy is loaded before the job starts, so that
    nothing is left to load once it has run; only by rank 0, which alone summarizes (the
    others would spend a second of every start on it)."""
    import os
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent("""
        import sys
        import commbench.launch.distributed as distributed
        from commbench.cli import main

        def start(*args, **kwargs):
            print("statistics loaded:", "scipy.stats" in sys.modules)
            raise SystemExit(0)

        distributed.init_distributed = start
        main()
    """)
    torchrun = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}
    found = subprocess.run([sys.executable, "-c", program, *command, "--results-dir",
                            str(tmp_path)], capture_output=True, text=True, timeout=120,
                           env={**os.environ, **torchrun})
    assert f"statistics loaded: {rank == 0}" in found.stdout, found.stdout + found.stderr
