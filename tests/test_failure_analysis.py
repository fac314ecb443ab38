"""What `compare` and `plot` show of runs trained to accuracy under --fail and a recovery
policy (issue 56): goodput beside the throughput during training, and whether two arms
ran under the same failure schedule. On the committed fixture runs, given by hand the
failures and the recovery facts a run records (commbench.faults.restart,
commbench.faults.torchft_costs); results without failures read as before."""

import copy
import io
import json
import shutil
from pathlib import Path

import pytest

from analysis_helpers import run_compare, run_report
from commbench.analysis import accuracy, reader
from commbench.analysis import plot_command as plot
from commbench.plots import accuracy as accuracy_charts
from commbench.plots import failure_rate
from test_accuracy_analysis import ACC, TARGET, TARGET_GROUP, docs, write_run

SPEC, POLICY = "1@step6:kill", "restart"


def under_failures(doc, goodput: float, spec: str = SPEC, policy: str = POLICY):
    """A copy of a result as the same run under --fail spec --recovery policy records it."""
    doc = copy.deepcopy(doc)
    doc["config"].update(fail=spec, recovery=policy)
    doc["failures"] = {"spec": spec, "events": []}
    doc["recovery"] = {
        "policy": policy, "checkpoint_every": 3, "restarts": 1, "wall_seconds": 50.0,
        "goodput": goodput, "wall_time_to_target": 50.0, "final_model_sha256": "0" * 64,
        "costs": [{"event": spec, "rank": 1, "failed_after_step": 5,
                   "failed_at": 1_700_000_000.0, "detection_seconds": 0.5,
                   "recovery_seconds": 12.25, "resumed_from_step": 3, "steps_lost": 2,
                   "samples_lost": 128}]}
    return doc


def arm(directory: Path, strategy: str = "allreduce", **failures) -> Path:
    """The target fixtures, the runs of `strategy` under failures (goodput 10, 12, 14 by
    seed)."""
    for path, doc in docs(TARGET):
        if doc["strategy"]["name"] == strategy:
            doc = under_failures(doc, 10.0 + 2 * (doc["config"]["seed"] - 42), **failures)
        write_run(directory, path.name, doc)
    return directory


def test_compare_says_two_arms_ran_under_different_failure_schedules(tmp_path):
    code, out, err = run_compare(TARGET, arm(tmp_path / "new"))
    assert code == 0 and err == "", err
    allreduce = next(li for li in out.splitlines() if li.startswith("allreduce "))
    assert allreduce.endswith("; failure schedules differ"), allreduce
    neighbor = next(li for li in out.splitlines() if li.startswith("neighbor_allreduce "))
    assert "failure" not in neighbor
    section = out.split("Under failures (--fail, --recovery)\n", 1)[1]
    assert "goodput: useful samples per second of wall time" in section
    rows = [li.split("  ") for li in section.splitlines() if li.startswith("allreduce ")]
    assert len(rows) == 1 and "neighbor_allreduce" not in section.split("\n\n\n")[0]
    cells = [c.strip() for c in rows[0] if c.strip()]
    img_sec = accuracy.rows_by_match(reader.read([TARGET])[0]["accuracy"])
    before = next(r for r in img_sec.values() if r.series.strategy == "allreduce").img_sec
    assert cells == ["allreduce", "-", "2", "none", "-", f"{before:.1f}", "-",
                     f"--fail {SPEC} --recovery {POLICY}", "12.0", f"{before:.1f}",
                     f"{12.25:.1f} s", "-", "DIFFER"]
    assert out.rstrip().endswith("; 1 under different failure schedules.")
    _, text, _ = run_compare(TARGET, tmp_path / "new", fmt="json")
    pairs = json.loads(text)["accuracy"]["pairs"]
    found = {p["strategy"]: p.get("failures") for p in pairs}
    assert found["neighbor_allreduce"] is None
    assert found["allreduce"] == {
        "base": {"failures": "none", "goodput": None, "img_sec": before,
                 "recovery_seconds": None, "rejoin_seconds": None},
        "new": {"failures": f"--fail {SPEC} --recovery {POLICY}", "goodput": 12.0,
                "img_sec": before, "recovery_seconds": 12.25, "rejoin_seconds": None},
        "goodput_ratio": None, "same_schedule": False}


def test_compare_sets_goodput_side_by_side_under_the_same_schedule(tmp_path):
    base, new = arm(tmp_path / "base"), tmp_path / "new"
    for path, doc in docs(base):
        if "recovery" in doc:  # the same failures, costing more, the worker back after
            doc["recovery"]["goodput"] *= 0.5
            doc["recovery"]["costs"][0].update(recovery_seconds=20.0 + doc["config"]["seed"],
                                               rejoin_seconds=30.0)
        write_run(new, path.name, doc)
    code, out, _ = run_compare(base, new, fmt="markdown")
    assert code == 0 and "failure schedules differ" not in out
    row = next(li for li in out.splitlines() if li.startswith("| allreduce |")
               and "--fail" in li)
    median = 20.0 + 43  # seeds 42, 43 and 44
    assert row.endswith(f"| 6.0 | {row.split(' | ')[9]} | {median:.1f} s, back after 30.0 s "
                        "| 0.500 | same |"), row
    assert f"| {12.25:.1f} s |" in row
    assert "under different failure schedules" not in out


def test_compare_without_failures_says_nothing_of_them():
    _, out, _ = run_compare(ACC, ACC)
    assert "failure" not in out.lower() and "goodput" not in out


def test_report_keeps_runs_under_other_failures_apart_from_those_without(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(TARGET, runs)
    for path, doc in docs(TARGET):
        if doc["strategy"]["name"] == "allreduce":
            write_run(runs, f"failed-{path.name}", under_failures(doc, 9.0))
    group = accuracy.group(reader.read([runs])[0]["accuracy"])[0]
    allreduce = [r for r in group.rows if r.series.strategy == "allreduce"]
    assert [r.failures for r in allreduce] == ["", f"--fail {SPEC} --recovery {POLICY}"]
    assert len(allreduce[0].runs) == len(allreduce[1].runs) > 1
    code, text, err = run_report([runs])
    assert code == 0, err
    rows = [li for li in text.splitlines() if li.startswith("allreduce ")]
    assert len(rows) == 2 and f"--fail {SPEC} --recovery {POLICY}" in rows[1], rows


def test_plot_draws_goodput_beside_the_throughput_where_runs_ran_under_failures(tmp_path):
    runs = arm(tmp_path / "runs")
    out, err = io.StringIO(), io.StringIO()
    assert plot.plot([runs], tmp_path / "charts", out=out, err=err) == 0, err.getvalue()
    names = sorted(Path(line).name for line in out.getvalue().splitlines())
    common = f"resnet18-c10_noise2_s320-iid-bs32-32px-{TARGET_GROUP}-fp32-cpu-gloo.png"
    assert names == ["accuracy-" + common, "goodput-" + common, "time-to-target-" + common]
    group = accuracy.group(reader.read([runs])[0]["accuracy"])[0]
    fig = accuracy_charts.goodput_figure(group, accuracy_charts.palette([group]))
    ax = fig.axes[0]
    # the row under failures is named with them: it is not a repeat of one without
    assert [t.get_text().replace("\n", " ") for t in ax.get_yticklabels()] == [
        f"allreduce, N=2, --fail {SPEC} --recovery {POLICY}",
        "neighbor_allreduce (exponential-2, dynamic, AWC), N=2"]
    bars = ax.patches
    heights = {(round(b.get_y() + b.get_height() / 2), b.get_hatch()): b.get_width()
               for b in bars}
    row = group.rows[0]
    assert heights[(0, None)] == row.img_sec and heights[(0, "//")] == 12.0
    assert (1, "//") not in heights  # no goodput recorded: no such bar
    assert any(f"--fail {SPEC} --recovery {POLICY}" in t.get_text() for t in ax.texts)
    # the time to target marks the runs under failures
    times = accuracy_charts.time_figure(group, accuracy_charts.palette([group])).axes[0]
    assert any("--fail" in t.get_text() for t in times.get_yticklabels())


def test_plot_draws_time_to_target_against_the_rate_of_failures(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(TARGET, runs)
    for path, doc in docs(TARGET):
        if doc["strategy"]["name"] != "allreduce":
            continue
        for spec, wall in (("none", 50.0), ("mtbf=120s,seed=1", 70.0),
                           ("mtbf=60s,seed=1", 90.0), ("mtbf=60s,seed=1,rejoin=5s", 80.0)):
            failed = under_failures(doc, 9.0, spec=spec)
            failed["recovery"]["wall_time_to_target"] = wall + doc["config"]["seed"]
            if spec == "mtbf=60s,seed=1" and doc["config"]["seed"] == 42:
                failed["recovery"]["survivors"] = [0]  # as gossip's: rank 1 lost for good
            write_run(runs, f"{spec.replace('=', '').replace(',', '')}-{path.name}", failed)
    out = io.StringIO()
    assert plot.plot([runs], tmp_path / "charts", out=out, err=io.StringIO()) == 0
    assert any(Path(li).name.startswith("failure-rate-") for li in out.getvalue().splitlines())
    group = accuracy.group(reader.read([runs])[0]["accuracy"])[0]
    ax = failure_rate.figure(group).axes[0]
    lines = {li.get_label(): li for li in ax.get_lines()}
    back = f"allreduce + {POLICY}, rejoining after 5 s, N=2"  # shares the failure-free point
    assert sorted(lines) == sorted([f"allreduce + {POLICY}, N=2", back])  # the runs without
    # failures of neighbor_allreduce: one rate alone, no line
    assert list(lines[back].get_xdata()) == [0.0, 60.0]
    line = lines[f"allreduce + {POLICY}, N=2"]
    seeds = sorted(d["config"]["seed"] for _, d in docs(TARGET)
                   if d["strategy"]["name"] == "allreduce")
    median_seed = seeds[len(seeds) // 2] if len(seeds) < 3 else sum(seeds[1:-1]) / (len(seeds) - 2)
    assert list(line.get_xdata()) == [0.0, 30.0, 60.0]
    assert list(line.get_ydata()) == pytest.approx([50 + median_seed, 70 + median_seed,
                                                    90 + median_seed])
    # the point whose runs did not all keep their workers says so; 3 runs a point
    assert [t.get_text() for t in ax.texts] == ["1 of 2 left"]
    assert ax.texts[0].xy == (60.0, pytest.approx(90 + median_seed))
    assert "no spread" not in ax.figure._suptitle.get_text()


def test_plot_without_failures_draws_no_goodput_chart(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(TARGET, runs)
    out = io.StringIO()
    assert plot.plot([runs], tmp_path / "charts", out=out, err=io.StringIO()) == 0
    assert not [li for li in out.getvalue().splitlines() if "goodput" in li]


def test_a_run_under_failures_reads_its_wall_time_from_the_policys_clock(tmp_path):
    """A restarted job's loop resumes its checkpoint's clock: the wall time to the target
    that report, compare and the failure-rate chart read is the policy's, from the
    job's first start; a run without a policy keeps its loop's."""
    rows = accuracy.rows_by_match(reader.read([arm(tmp_path)])[0]["accuracy"])
    reached = [(row.series.strategy, run) for row in rows.values() for run in row.runs
               if run.reached]
    assert {strategy for strategy, _ in reached} >= {"allreduce", "neighbor_allreduce"}
    for strategy, run in reached:
        loop = run.doc["summary"]["wall_time_to_target"]
        assert loop != 50.0
        assert run.wall_time == pytest.approx(50.0 if strategy == "allreduce" else loop)
