"""Numbers a user can trust: the in-job reference's windows and drift, E* and the
overhead with their intervals, oversubscription, and the flags that `run`, `report`,
`plot` and `sweep` put on what is not to be trusted."""

import copy
import io
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cli_helpers import commbench
from commbench.result import metrics
from commbench.analysis import report
from launchers import PYTHON, TINY_RUN

RUNS = Path(__file__).parent / "data" / "runs"
IMAGES = 16  # batch 8 x 2 batches per iteration


def summarize(reference_seconds, windows, iteration_seconds=None):
    iteration_seconds = iteration_seconds or [[0.2, 0.21, 0.2, 0.19]] * 2
    batches = [[[s / 2, s / 2] for s in rank] for rank in iteration_seconds]
    return metrics.summarize(8, 2, iteration_seconds, batches, reference_seconds, windows)


def test_reference_windows_that_overlap_are_trusted():
    s = summarize([[0.1, 0.1, 0.1, 0.1]] * 2, [[[0, 1], [5, 6]], [[0.01, 1], [5.02, 6]]])
    assert s["reference_overlap"] > 0.9 and s["reference_drift"] == pytest.approx(0)
    assert "reference" not in metrics.trust_flags(s)


def test_a_rank_that_starts_its_reference_late_is_detected():
    late = [[[0, 1], [5, 6]], [[1.5, 2.5], [5, 6]]]  # rank 1 began after rank 0 ended
    s = summarize([[0.1, 0.1, 0.1, 0.1]] * 2, late)
    assert s["reference_overlap"] < 0
    assert "reference" in metrics.trust_flags(s)


def test_drift_between_the_halves_is_detected():
    s = summarize([[0.1, 0.1, 0.2, 0.2]] * 2, [[[0, 1], [5, 6]]] * 2)
    assert s["reference_drift"] == pytest.approx(-0.5)
    assert "reference" in metrics.trust_flags(s)


def test_in_job_efficiency_and_overhead_come_with_their_intervals():
    s = summarize([[0.1, 0.11, 0.1, 0.09]] * 2, [[[0, 1], [5, 6]]] * 2)
    total = metrics.total_throughput(IMAGES, [[0.2, 0.21, 0.2, 0.19]] * 2)
    compute = metrics.total_throughput(IMAGES, [[0.1, 0.11, 0.1, 0.09]] * 2)
    assert s["efficiency_in_job"] == pytest.approx(total.mean() / compute.mean())
    assert 0 < s["efficiency_in_job_ci95"] < 0.2
    assert s["communication_overhead"] == pytest.approx(0.5, abs=0.01)
    assert 0 < s["communication_overhead_ci95"] < 0.2


@pytest.mark.parametrize("change, flag", [
    ({"efficiency_in_job": 1.17}, "E*>100%"),
    ({"communication_overhead": -0.17}, "comm<0"),
    ({"total_img_sec": {"mean": 679.0, "ci95": 210.0}}, "noisy"),
    ({"total_img_sec": {"mean": 679.0, "ci95": None}}, "noisy"),  # one iteration
    ({"oversubscribed": {"machine": "vm", "workers": 4, "physical_cores": 2}},
     "oversubscribed"),
])
def test_what_is_not_to_be_trusted_is_flagged(change, flag):
    fine = {"total_img_sec": {"mean": 679.0, "ci95": 10.0}, "efficiency_in_job": 0.9,
            "communication_overhead": 0.1}
    assert metrics.trust_flags(fine) == []
    assert metrics.trust_flags({**fine, **change}) == [flag]
    assert metrics.trust_flags(fine, efficiency=1.1) == ["E(N)>100%"]


def test_oversubscription_counts_workers_against_physical_cores():
    from commbench.launch.distributed import DistContext
    from commbench.launch.detect import LaunchInfo
    from commbench.job.per_iteration import oversubscribed

    def ctx(hosts, cores, device="cpu"):
        return DistContext(LaunchInfo("openmpi", 0, len(hosts)), SimpleNamespace(type=device),
                           "gloo", tuple(hosts), 0, False, (), tuple(cores))

    assert oversubscribed(ctx(["a", "a"], [2, 2])) is None
    assert oversubscribed(ctx(["a"] * 4, [2] * 4)) == {"machine": "a", "workers": 4,
                                                       "physical_cores": 2}
    assert oversubscribed(ctx(["a", "a", "b", "b", "b"], [2, 2, 2, 2, 2]))["machine"] == "b"
    assert oversubscribed(ctx(["a"] * 4, [2] * 4, device="cuda")) is None


def test_torchfts_replica_groups_count_as_workers_of_their_host(monkeypatch):
    """Each group is a world of one, and `commbench torchft` starts them all on this
    host (or on its emulated machines, which share its cores)."""
    from commbench.faults import torchft_group
    from commbench.launch.distributed import DistContext
    from commbench.launch.detect import LaunchInfo
    from commbench.job.per_iteration import oversubscribed

    group = DistContext(LaunchInfo("torchrun", 0, 1), SimpleNamespace(type="cpu"), "gloo",
                        ("m1",), 0, False, (), (2,))
    assert oversubscribed(group) is None  # one process alone
    monkeypatch.setenv(torchft_group.GROUPS, "4")
    monkeypatch.setenv(torchft_group.GROUP, "1")
    assert oversubscribed(group) == {"machine": "m1", "workers": 4, "physical_cores": 2}
    monkeypatch.setenv(torchft_group.GROUPS, "2")
    assert oversubscribed(group) is None


def write_doc(directory, name, doc):
    path = directory / name
    path.write_text(json.dumps(doc))
    return path


def test_report_marks_a_synthetic_run_that_claims_too_much(tmp_path):
    doc = json.loads(next(RUNS.glob("*-neighbor_allreduce-ring-n2-*.json")).read_text())
    doc = copy.deepcopy(doc)
    doc["summary"].update(efficiency_in_job=1.175, communication_overhead=-0.172)
    write_doc(tmp_path, "claims.json", doc)
    out = io.StringIO()
    assert report.report([tmp_path], "csv", out=out, err=io.StringIO()) == 0
    row = out.getvalue().splitlines()[1]
    assert "E*>100% comm<0" in row
    text = io.StringIO()
    report.report([tmp_path], "text", out=text, err=io.StringIO())
    line = next(x for x in text.getvalue().splitlines() if x.startswith("neighbor_allreduce"))
    assert "117.5%!" in line and "-17.2%!" in line
    assert "comm<0: negative communication overhead is impossible" in text.getvalue()


def test_sweep_dry_run_interleaves_repeats(tmp_path):
    done = commbench("sweep", "--dry-run", "--repeat", "2", "--np", "1,2", "--dist-optimizer",
                     "allreduce,none", "--results-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    order = [(line.split("--dist-optimizer=")[1].split()[0], line.split(" -n ")[1].split()[0],
              line.split("# repeat ")[1]) for line in done.stdout.splitlines()]
    configurations = [("allreduce", "1"), ("allreduce", "2"), ("none", "1"), ("none", "2")]
    assert order == [(s, n, f"{r}/2") for r in (1, 2) for s, n in configurations]


@pytest.mark.job
def test_a_run_measures_its_reference_before_and_after_together(tmp_path):
    done = subprocess.run([PYTHON, "-m", "commbench", "--dist-optimizer", "allreduce", *TINY_RUN,
                           "--reference-seconds", "1", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    samples, summary = doc["samples"], doc["summary"]
    (windows,) = samples["reference_windows"]  # one rank, two halves
    assert len(windows) == 2 and windows[0][1] <= windows[1][0]
    # Sized on the fastest batch of a probe: each half lasts about --reference-seconds
    # (its wall time also moves with the machine's bursts of speed, hence the slack;
    # one iteration of two batches, unsized, would last a small part of it)
    batches = np.asarray(samples["reference_batch_seconds"][0])
    assert batches.size // 2 * float(np.median(batches)) >= 0.5 * 1
    assert len(samples["reference_seconds"][0]) % 2 == 0
    assert np.shape(samples["reference_batch_seconds"][0])[1] == 2  # batches per iteration
    # forward, backward, optimizer of each batch of one iteration; backward is the largest
    # (compared on each phase's faster batch: a loaded machine only ever adds time)
    (split,) = samples["reference_phase_seconds"]
    assert np.shape(split) == (2, 3) and all(f > 0 and b > 0 and o > 0 for f, b, o in split)
    forward, backward, _ = np.min(split, axis=0)
    assert backward > forward
    assert summary["reference_overlap"] == pytest.approx(1.0)
    assert "efficiency_in_job_ci95" in summary and "reference_drift" in summary
    assert "Measuring the compute-only reference again..." in done.stdout
    assert "in-job scaling efficiency" in done.stdout and "95% CI" in done.stdout
