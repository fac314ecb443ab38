"""`report`, `compare`, `plot` and `sweep --repeat` for runs trained to accuracy: the
rule that combines repeated runs' times to the target (on hand-made numbers), and the
commands on the committed fixture runs of tests/data/accuracy (real runs; see its
README), against golden output where that is simplest
(regenerate with: bash tests/data/make_fixtures.sh --golden)."""

import copy
import csv
import io
import itertools
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from analysis_helpers import run_compare, run_report
from cli_helpers import commbench
from commbench.analysis import accuracy, reader
from commbench.analysis import plot_command as plot
from commbench.analysis import time_to_target as ttt
from commbench.plots import accuracy as accuracy_charts

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
ACC, GOLDEN, SPEED = DATA / "accuracy", DATA / "golden", DATA / "runs-new"
TARGET = ACC / "target"
TARGET_GROUP = "target0.35"


def docs(directory: Path):
    """(path, document) of every result in a directory, by name."""
    return [(p, json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]


def fixture(strategy: str, seed: int):
    """The path and document of the target fixture run of a strategy and seed."""
    return next((p, d) for p, d in docs(TARGET)
                if d["strategy"]["name"] == strategy and d["config"]["seed"] == seed)


def missed_fixture():
    found = [(p, d) for p, d in docs(TARGET) if not d["summary"]["reached"]]
    assert len(found) == 1, "the fixtures must hold exactly one run that missed the target"
    return found[0]


def table_rows(text: str, heading: str):
    """The data rows (split on 2+ spaces) of the text table under the heading that
    contains `heading`."""
    part = text.split(heading, 1)[1]
    lines = part.split("\n\n")[2].splitlines()  # heading | details | table
    assert set(lines[1]) <= {"-", " "}
    return {tuple(re.split(r" {2,}", line.strip())[:3]): re.split(r" {2,}", line.strip())
            for line in lines[2:]}


def write_run(directory: Path, name: str, doc) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(doc))
    return path


def retimed(doc, factor: float, seed: int):
    """A copy of a result whose training took `factor` times as long, with another
    seed (a repeat of its own); a run that missed the target still misses it."""
    doc = copy.deepcopy(doc)
    doc["config"]["seed"] = seed
    s = doc["summary"]
    for key in ("time_to_target", "wall_time_to_target", "training_seconds", "wall_seconds"):
        if s.get(key) is not None:
            s[key] *= factor
    s["img_sec"] /= factor
    for point in doc["curve"]:
        point["training_seconds"] *= factor
        point["wall_seconds"] *= factor
    return doc


def arm(target: Path, factor: float = 1.0, jitter=(0.95, 1.0, 1.05)) -> Path:
    """An arm of len(jitter) runs per fixture run (9 per row), each repeat's times
    scaled by jitter and the whole arm by factor: enough runs for a difference to be
    significant."""
    for path, doc in docs(TARGET):
        for i, j in enumerate(jitter):
            seed = doc["config"]["seed"] + 100 * i
            write_run(target, f"{path.stem}-{i}.json", retimed(doc, factor * j, seed))
    return target


# ---------------------------------------------------------------------------------------
# MLPerf Training's rule, on hand-made numbers


@pytest.mark.parametrize("times, value, kept", [
    ([5.0, 1.0, 3.0, 2.0, 4.0], 3.0, 3),  # 1 and 5 dropped: mean of 2, 3, 4
    ([10.0, 1.0, 2.0, 3.0, 100.0], 5.0, 3),  # the outliers are what is dropped
    ([1.0, 2.0, 9.0], 2.0, 1),  # three runs: the middle one
    ([2.0, 4.0, 6.0, 8.0], 5.0, 2),
])
def test_olympic_drops_the_fastest_and_the_slowest_and_averages_the_rest(times, value, kept):
    for order in itertools.permutations(times):
        combined = ttt.combine(list(order))
        assert combined.rule == ttt.OLYMPIC and combined.label() == "olympic"
        assert combined.value == pytest.approx(value)
    assert combined.why == (f"mean of {kept} of {len(times)} runs, fastest and slowest "
                            "dropped")


@pytest.mark.parametrize("times, value", [
    ([1.0, 2.0, None], 2.0),  # the miss is the slowest, dropped; so is 1.0
    ([None, 3.0, 1.0, 2.0], 2.5),
    ([4.0, 1.0, None, 2.0, 3.0], 3.0),  # 1.0 and the miss dropped: mean of 2, 3, 4
])
def test_one_run_that_missed_is_dropped_as_the_slowest(times, value):
    for order in itertools.permutations(times):
        combined = ttt.combine(list(order))
        assert combined.rule == ttt.OLYMPIC
        assert combined.value == pytest.approx(value) and math.isfinite(combined.value)


@pytest.mark.parametrize("times, missed", [([1.0, None, None], 2), ([None, None, None], 3),
                                           ([1.0, 2.0, None, 3.0, None], 2)])
def test_two_or_more_runs_that_missed_give_no_time(times, missed):
    combined = ttt.combine(times)
    assert combined.value is None and combined.rule == ttt.INVALID
    assert combined.label() == f"invalid ({missed} missed)"


@pytest.mark.parametrize("times, value", [([4.0, 2.0], 3.0), ([7.0], 7.0), ([None], None),
                                          ([4.0, None], None), ([None, None], None)])
def test_fewer_than_three_runs_give_the_median_marked_as_such(times, value):
    combined = ttt.combine(times)
    assert combined.rule == ttt.MEDIAN and combined.label() == "median (<3 runs)"
    assert combined.value == value
    assert combined.why.startswith(f"too few runs for MLPerf's rule ({len(times)} < 3)")
    # half a run that reached nothing is no time: the median names the missed run
    assert ("did not reach the target" in combined.why) == (value is None)


def test_median_and_spread_count_a_miss_as_slowest_and_never_as_a_time():
    assert ttt.median([3.0, None, 1.0]) == 3.0
    assert ttt.median([3.0, None, None]) is None
    assert ttt.median([1.0, 2.0, 3.0, None]) == 2.5
    assert ttt.median([1.0, 2.0, None, None]) is None
    assert ttt.median([]) is None
    assert ttt.spread([3.0, None, 1.0]) == (1.0, 3.0)
    assert ttt.spread([None, None]) is None


def test_rank_test_exact_and_a_miss_ranks_slowest():
    from scipy import stats

    assert ttt.mann_whitney_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    # fully apart: the smallest p the arms' sizes allow
    assert ttt.mann_whitney_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.1)
    assert ttt.smallest_p(3, 3) == pytest.approx(0.1)
    five = ttt.mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert five == pytest.approx(2 / 252) == pytest.approx(ttt.smallest_p(5, 5))
    # runs that never reached the target are slower than any time, however long
    assert ttt.mann_whitney_p([1.0, 2.0, 3.0, 4.0], [None] * 4) == \
        ttt.mann_whitney_p([1.0, 2.0, 3.0, 4.0], [1e9] * 4) == pytest.approx(2 / 70)
    # without ties, exactly scipy's exact test
    a, b = [1.1, 3.4, 2.2, 5.0, 0.7], [2.9, 4.4, 6.1, 3.9]
    assert ttt.mann_whitney_p(a, b) == pytest.approx(
        stats.mannwhitneyu(a, b, alternative="two-sided", method="exact").pvalue)
    assert ttt.mann_whitney_p([], [1.0]) is None


# ---------------------------------------------------------------------------------------
# report


def test_the_fixtures_have_a_row_with_a_run_that_missed():
    groups = accuracy.group(reader.read([ACC])[0]["accuracy"])
    rows = {(r.series.strategy, r.workers): r for g in groups if g.key.target for r in g.rows}
    assert {k: (v.reached, len(v.runs)) for k, v in rows.items()} == {
        ("allreduce", 2): (2, 3), ("neighbor_allreduce", 2): (3, 3)}
    assert [r.seed for r in rows[("allreduce", 2)].runs] == [42, 43, 44]


def test_report_matches_the_golden_output():
    code, out, err = run_report([ACC])
    assert code == 0 and err == ""
    assert out == (GOLDEN / "accuracy-report.txt").read_text()


def test_report_text_rows_combine_the_repeats():
    _, text, _ = run_report([ACC])
    assert text.index("no target") < text.index("target 0.35")  # one table per group
    rows = table_rows(text, "target 0.35")
    allreduce = rows[("allreduce", "-", "2")]
    # runs, reached, time s, by, median s, min-max s, steps, epochs, sent, best if missed
    times = sorted(d["summary"]["time_to_target"] for _, d in docs(TARGET)
                   if d["strategy"]["name"] == "allreduce" and d["summary"]["reached"])
    best = missed_fixture()[1]["summary"]["best_accuracy"]
    assert allreduce[3:13] == ["3", "2/3", f"{times[1]:.2f}", "olympic", f"{times[1]:.2f}",
                               f"{times[0]:.2f}-{times[1]:.2f}", "15", "3.00", "-",
                               f"{best:.3f}"]
    neighbor = rows[("neighbor_allreduce", "exponential-2, dynamic, AWC", "2")]
    times = sorted(d["summary"]["time_to_target"] for _, d in docs(TARGET)
                   if d["strategy"]["name"] == "neighbor_allreduce")
    assert neighbor[3:7] == ["3", "3/3", f"{times[1]:.2f}", "olympic"]
    assert neighbor[12] == "-"  # no run missed: no best-if-missed
    assert neighbor[-1] == "-"  # three seeds, two cores: nothing to distrust
    untargeted = table_rows(text, "no target")[("allreduce", "-", "2")]
    assert untargeted[3:11] == ["1", "no target"] + ["-"] * 6


def test_report_json_gives_the_rule_the_files_and_each_run():
    code, out, err = run_report([ACC], "json")
    assert code == 0 and err == ""
    groups = json.loads(out)["accuracy_groups"]
    assert [g["key"]["target"] for g in groups] == ["", "0.35"]
    assert groups[0]["key"]["data"] == "learnable:classes=10,noise=2,samples=320"
    rows = {r["strategy"]: r for r in groups[1]["rows"]}
    by_file = {str(p): d for p, d in docs(TARGET)}
    for name, row in rows.items():
        times = [by_file[f]["summary"]["time_to_target"] for f in row["files"]]
        walls = [by_file[f]["summary"]["wall_time_to_target"] for f in row["files"]]
        assert len(row["files"]) == row["runs"] == 3 and row["seeds"] == "42 43 44"
        assert row["rule"] == row["wall_rule"] == "olympic"
        assert row["time_to_target_s"] == pytest.approx(ttt.combine(times).value)
        assert row["wall_time_to_target_s"] == pytest.approx(ttt.combine(walls).value)
        assert row["reached"] == sum(t is not None for t in times)
        assert row["target"] == "0.35" and row["flags"] == ""
    assert rows["allreduce"]["reached"] == 2 and rows["neighbor_allreduce"]["reached"] == 3
    untargeted = groups[0]["rows"][0]
    assert untargeted["reached"] is None and untargeted["time_to_target_s"] is None
    assert untargeted["rule"] is None and untargeted["median_time_to_target_s"] is None


def test_a_run_that_missed_shows_its_best_accuracy_and_never_a_time():
    _, out, _ = run_report([TARGET], "json")
    path, doc = missed_fixture()
    row = next(r for r in json.loads(out)["accuracy_groups"][0]["rows"]
               if str(path) in r["files"])
    detail = next(d for d in row["runs_detail"] if d["file"] == str(path))
    assert detail["reached"] is False and detail["stopped_by"] == "max epochs"
    assert all(detail[k] is None for k in ("time_to_target_s", "wall_time_to_target_s",
                                           "steps_to_target", "epochs_to_target"))
    assert detail["best_accuracy"] == row["best_accuracy_missed"] == \
        doc["summary"]["best_accuracy"] < 0.35
    # the median falls on a run that reached it; the steps' median too
    assert row["median_steps_to_target"] == 15 and row["median_time_to_target_s"] > 0


def test_a_missed_run_gets_no_time_even_if_its_file_gives_one(tmp_path):
    path, doc = missed_fixture()
    lying = copy.deepcopy(doc)
    lying["summary"].update(time_to_target=0.001, wall_time_to_target=0.001,
                            steps_to_target=1, epochs_to_target=0.1)
    write_run(tmp_path, path.name, lying)
    for other, d in docs(TARGET):
        if d["strategy"]["name"] == "allreduce" and other != path:
            write_run(tmp_path, other.name, d)
    _, honest, _ = run_report([TARGET], "json")
    _, out, _ = run_report([tmp_path], "json")
    row = json.loads(out)["accuracy_groups"][0]["rows"][0]
    before = next(r for r in json.loads(honest)["accuracy_groups"][0]["rows"]
                  if r["strategy"] == "allreduce")
    assert row["min_time_to_target_s"] == before["min_time_to_target_s"] > 0.001
    assert row["time_to_target_s"] == before["time_to_target_s"]
    # reached without a time is not a usable result: skipped, with a warning
    broken = copy.deepcopy(fixture("neighbor_allreduce", 42)[1])
    broken["summary"]["time_to_target"] = None
    write_run(tmp_path / "broken", "broken.json", broken)
    code, _, err = run_report([tmp_path / "broken", tmp_path])
    assert code == 0 and "broken.json: incomplete or malformed accuracy result" in err
    assert "reached the target but records no time" in err


@pytest.mark.parametrize("picks, by", [
    # two runs that reached it: their median, marked
    ([("neighbor_allreduce", 42, 0), ("neighbor_allreduce", 43, 0)], "median (<3 runs)"),
    # one reached, one missed: the median falls between them, so no time
    ([("allreduce", 43, 0), ("allreduce", 44, 0)], "median (<3 runs)"),
    # three runs, two missed (the run that missed, again with another seed): no time
    ([("allreduce", 43, 0), ("allreduce", 44, 0), ("allreduce", 44, 10)], "invalid (2 missed)"),
])
def test_rows_without_an_olympic_time(tmp_path, picks, by):
    times = []
    for i, (strategy, seed, other_seed) in enumerate(picks):
        doc = fixture(strategy, seed)[1]
        write_run(tmp_path, f"{i}.json", retimed(doc, 1.0, seed + other_seed))
        times.append(doc["summary"]["time_to_target"])
    _, text, _ = run_report([tmp_path])
    topology = "-" if picks[0][0] == "allreduce" else "exponential-2, dynamic, AWC"
    row = table_rows(text, "target 0.35")[(picks[0][0], topology, "2")]
    expected = "-" if None in times else f"{sum(times) / 2:.2f}"
    assert row[4:7] == [f"{sum(t is not None for t in times)}/{len(times)}", expected, by]
    assert row[7] == expected  # median s: the same median, or none


def test_report_of_speed_and_accuracy_runs_together_has_both_tables():
    code, text, err = run_report([SPEED, ACC])
    assert code == 0 and err == ""
    assert "E(N)" in text and "total img/sec" in text  # the speed runs' table
    assert text.count("Time to accuracy: resnet18") == 2  # the two accuracy groups
    assert text.index("E(N) = ") < text.index("Time to accuracy: resnet18")
    code, out, _ = run_report([SPEED, ACC], "json")
    doc = json.loads(out)
    assert code == 0 and set(doc) == {"groups", "accuracy_groups"}
    speed_files = {f for g in doc["groups"] for r in g["rows"] for f in r["files"]}
    assert speed_files == {str(p) for p in SPEED.glob("*.json")}
    assert sum(len(r["files"]) for g in doc["accuracy_groups"] for r in g["rows"]) == 8


SPLIT = {"step": 0.4, "compute": 0.2, "overlapped": 0.05, "exposed": 0.1, "waiting": 0.04,
         "other": 0.01, "codec": 0.05, "injected": 0.0}


def with_split(directory: Path) -> Path:
    """The target fixtures as runs record them now: a step split with a codec part, and
    what each worker sent per step."""
    for path, doc in docs(TARGET):
        doc["summary"]["step_split"] = {k: {"mean": v, "median": v, "p10": v, "p90": v}
                                        for k, v in SPLIT.items()}
        doc["summary"]["wire"] = {"bytes_per_step": 3 * 2 ** 20, "messages_per_step": 6,
                                  "bytes_per_image": 1024}
        write_run(directory, path.name, doc)
    return directory


def test_report_shows_where_the_steps_to_the_target_went_codec_included(tmp_path):
    code, text, err = run_report([with_split(tmp_path / "runs")])
    assert code == 0 and err == ""
    table = text.split("Where a step's time goes")[1]
    rows = [line.split() for line in table.splitlines() if line.startswith("allreduce")]
    # step, compute, codec, exposed, waiting, injected, other, hidden, sent/step
    assert rows == [["allreduce", "-", "2", "400.0", "200.0", "50.0", "100.0", "40.0", "0.0",
                     "10.0", "50.0", "3M"]]
    _, out, _ = run_report([tmp_path / "runs"], "json")
    row = next(r for r in json.loads(out)["accuracy_groups"][0]["rows"]
               if r["strategy"] == "allreduce")
    assert row["step_split"] == pytest.approx(SPLIT)
    assert row["wire"]["bytes_per_step"] == 3 * 2 ** 20
    # runs without a split (the plain fixtures) get no such table
    assert "Where a step's time goes" not in run_report([TARGET])[1]


def test_a_result_with_a_broken_wire_record_is_skipped_in_one_line(tmp_path):
    runs = with_split(tmp_path / "runs")
    broken = sorted(runs.glob("*.json"))[0]
    doc = json.loads(broken.read_text())
    doc["summary"]["wire"]["bytes_per_step"] = "3M"
    broken.write_text(json.dumps(doc))
    code, text, err = run_report([runs])
    assert code == 0 and "Where a step's time goes" in text
    assert broken.name in err and "summary.wire.bytes_per_step" in err
    assert len(err.strip().splitlines()) == 1


def test_csv_has_one_row_per_strategy_and_no_column_twice():
    code, out, _ = run_report([ACC], "csv")
    header = next(csv.reader(io.StringIO(out)))
    assert code == 0 and len(header) == len(set(header))
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["target"], r["strategy"], r["reached"]) for r in rows] == [
        ("", "allreduce", ""), ("", "neighbor_allreduce", ""),
        ("0.35", "allreduce", "2"), ("0.35", "neighbor_allreduce", "3")]


# ---------------------------------------------------------------------------------------
# compare


def test_an_arm_compared_with_itself_is_unchanged():
    code, out, err = run_compare(ACC, ACC, fail_on_regression=True)
    assert code == 0 and err == ""
    assert "Mann-Whitney U test" in out and "SLOWER" not in out
    assert out.count("not enough runs (3 vs 3)") == 2  # 3 against 3: p >= 0.1, always
    assert out.count("n/a: no target") == 2
    assert "Time to accuracy: 4 compared: 0 faster, 0 slower, 2 with not enough runs" in out


def test_identical_arms_with_enough_runs_are_not_significant(tmp_path):
    base = arm(tmp_path / "base")
    code, out, _ = run_compare(base, base, fail_on_regression=True)
    results = [line.split("  ")[-1] for line in out.splitlines()
               if line.startswith(("allreduce ", "neighbor_allreduce "))]
    assert code == 0 and results == ["~ (not significant)"] * 2
    assert out.count(" 1.000  +0.0%  1  ") == 2  # ratio, delta and p of equal arms
    assert "0 faster, 0 slower, 0 with not enough runs, 2 unchanged or undecided" in out


def test_an_arm_twice_as_slow_is_slower_and_fails_when_asked(tmp_path):
    base, slow = arm(tmp_path / "base"), arm(tmp_path / "slow", factor=2.0)
    code, out, _ = run_compare(base, slow)
    assert code == 0
    neighbor = next(line for line in out.splitlines() if line.startswith("neighbor_allreduce"))
    assert neighbor.split()[-1] == "SLOWER" and "2.000" in neighbor and "+100.0%" in neighbor
    # allreduce's real runs are 5x apart and a third of them missed (tied, slowest):
    # twice as slow is within that spread, so no verdict
    allreduce = next(line for line in out.splitlines() if line.startswith("allreduce "))
    assert "6/9" in allreduce and allreduce.endswith("~ (not significant)")
    assert "Time to accuracy: 2 compared: 0 faster, 1 slower, 0 with not enough runs, " \
        "1 unchanged or undecided; 0 unmatched." in out
    assert run_compare(base, slow, fail_on_regression=True)[0] == 1
    code, out, _ = run_compare(slow, base, fail_on_regression=True)  # faster: no failure
    assert code == 0 and "faster" in out and "SLOWER" not in out
    # beyond the threshold nothing has changed, however significant
    code, out, _ = run_compare(base, slow, threshold=1.5, fail_on_regression=True)
    assert code == 0 and "SLOWER" not in out and "below 150%" in out
    # as a command: the exit status a CI job would see
    proc = commbench("compare", base, slow, "--fail-on-regression", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    pairs = {p["strategy"]: p for p in json.loads(proc.stdout)["accuracy"]["pairs"]}
    assert pairs["neighbor_allreduce"]["result"] == "SLOWER"
    assert pairs["neighbor_allreduce"]["p"] == pytest.approx(2 / math.comb(18, 9))
    assert pairs["neighbor_allreduce"]["base"]["runs"] == 9
    assert pairs["allreduce"]["new"]["reached"] == 6
    assert None in pairs["allreduce"]["new"]["times_to_target_s"]  # the misses, as such


def test_a_missed_run_in_one_arm_counts_as_slowest(tmp_path):
    # the same runs, except that in NEW every neighbor_allreduce run missed the target
    base = arm(tmp_path / "base")
    worse = tmp_path / "worse"
    shutil.copytree(base, worse)
    for path in sorted(worse.glob("*neighbor_allreduce*.json")):
        doc = json.loads(path.read_text())
        doc["summary"].update(reached=False, time_to_target=None, wall_time_to_target=None,
                              steps_to_target=None, epochs_to_target=None,
                              samples_to_target=None, stopped_by="max epochs")
        path.write_text(json.dumps(doc))
    code, out, _ = run_compare(base, worse, fail_on_regression=True)
    neighbor = next(line for line in out.splitlines() if line.startswith("neighbor_allreduce"))
    assert code == 1 and neighbor.split()[-1] == "SLOWER" and "0/9" in neighbor
    assert re.search(r"  -  +0/9  +-  +-  ", neighbor)  # no median, ratio or delta to give


# ---------------------------------------------------------------------------------------
# plot


def test_plot_writes_curves_and_time_to_target_charts(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    code = plot.plot([ACC], tmp_path, out=out, err=err)
    paths = [Path(line) for line in out.getvalue().splitlines()]
    assert code == 0 and err.getvalue() == ""
    common = "resnet18-c10_noise2_s320-iid-bs32-32px-{}-fp32-cpu-gloo.png"
    assert sorted(p.name for p in paths) == [
        "accuracy-" + common.format("notarget"), "accuracy-" + common.format(TARGET_GROUP),
        "time-to-target-" + common.format(TARGET_GROUP)]  # no time without a target
    for path in paths:
        assert path.parent == tmp_path and path.stat().st_size > 20_000


def test_time_chart_places_only_runs_that_reached_the_target():
    groups = accuracy.group(reader.read([ACC])[0]["accuracy"])
    group = next(g for g in groups if g.key.target)
    styles = accuracy_charts.palette(groups)
    fig = accuracy_charts.time_figure(group, styles)
    ax = fig.axes[0]
    # long names wrapped, so that they leave the axes their width
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "allreduce, N=2", "neighbor_allreduce (exponential-2, dynamic,\nAWC), N=2"]
    best = missed_fixture()[1]["summary"]["best_accuracy"]
    assert [t.get_text() for t in ax.texts] == [f"2/3 reached; 1 missed (best {best:.3f})",
                                                "3/3 reached"]
    ticks = [line for line in ax.get_lines() if line.get_marker() == "|"]
    assert [len(line.get_xdata()) for line in ticks] == [2, 3]
    xs = [x for line in ax.get_lines() for x in line.get_xdata()]
    assert all(math.isfinite(x) for x in xs) and max(xs) < ax.get_xlim()[1]
    # combined by MLPerf's rule: filled markers
    marks = [line for line in ax.get_lines() if line.get_marker() not in ("|", "None", "")]
    assert len(marks) == 2 and all(m.get_markerfacecolor() != "white" for m in marks)


def test_curves_chart_has_every_repeat_and_the_target():
    groups = accuracy.group(reader.read([ACC])[0]["accuracy"])
    group = next(g for g in groups if g.key.target)
    fig = accuracy_charts.curves_figure(group, accuracy_charts.palette(groups))
    by_time, by_epoch = fig.axes
    # per row: 2 faint repeats, the median run and its worst worker; plus the target line
    assert len(by_time.get_lines()) == len(by_epoch.get_lines()) == 2 * 4 + 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "allreduce, N=2", "neighbor_allreduce (exponential-2, dynamic, AWC), N=2",
        "averaged model (bold: the run of median time to target)", "worst worker",
        "target 0.35"]


# ---------------------------------------------------------------------------------------
# sweep --repeat


def dry_run(tmp_path, *flags):
    proc = commbench("sweep", "--dry-run", "--np", "1,2", "--dist-optimizer",
                     "allreduce,neighbor_allreduce", "--repeat", "3", "--results-dir",
                     tmp_path / "results", *flags, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    jobs = []
    for line in proc.stdout.strip().splitlines():
        parts = line.split()
        seeds = [parts[i + 1] for i, p in enumerate(parts) if p == "--seed"]
        seeds += [p.split("=", 1)[1] for p in parts if p.startswith("--seed=")]
        repeat = re.search(r"# repeat (\d)/3$", line)
        strategy = next(p.split("=")[1] for p in parts if p.startswith("--dist-optimizer="))
        jobs.append((int(repeat.group(1)) if repeat else 1, strategy, parts[2], seeds))
    assert not (tmp_path / "results").exists()
    return jobs


def test_sweep_repeats_to_accuracy_draw_a_seed_per_repeat(tmp_path):
    jobs = dry_run(tmp_path, "--data", "learnable:samples=320", "--target-accuracy", "0.8",
                   "--eval-every", "2")
    assert len(jobs) == 12  # 2 strategies x 2 counts x 3 repeats
    for repeat, strategy, workers, seeds in jobs:
        assert seeds == [str(41 + repeat)], (repeat, strategy, workers, seeds)
    assert {(r, s, n) for r, s, n, _ in jobs} == {
        (r, s, n) for r in (1, 2, 3) for s in ("allreduce", "neighbor_allreduce")
        for n in ("1", "2")}


def test_a_repeats_seed_replaces_the_one_given_before_the_results_dir():
    from commbench.sweep.plan import with_seed

    base = ["mpiexec", "-n", "2", "python", "-m", "commbench", "--dist-optimizer=allreduce"]
    assert with_seed(base + ["--seed=7", "--results-dir", "r"], 8) == \
        base + ["--seed", "8", "--results-dir", "r"]
    assert with_seed(base + ["--seed", "7", "--lr", "0.1", "--results-dir", "r"], 9) == \
        base + ["--lr", "0.1", "--seed", "9", "--results-dir", "r"]
    assert with_seed(base, 3) == base + ["--seed", "3"]


def test_speed_sweep_repeats_keep_one_seed(tmp_path):
    jobs = dry_run(tmp_path, "--batch-size", "8", "--seed", "5")
    assert len(jobs) == 12 and all(seeds == ["5"] for *_, seeds in jobs)


def test_the_bytes_each_worker_sent_to_the_target_are_reported(tmp_path):
    for path in ACC.rglob("*.json"):
        doc = json.loads(path.read_text())
        if doc["summary"].get("reached"):
            doc["summary"]["bytes_to_target"] = 1.5 * 2 ** 20
        elif doc["summary"].get("reached") is False:  # a miss has none, whatever it says
            doc["summary"]["bytes_to_target"] = 99.0
        (tmp_path / path.name).write_text(json.dumps(doc))
    code, out, err = run_report([tmp_path])
    assert code == 0 and err == ""
    rows = [line for line in out.splitlines() if re.match(r"(allreduce|neighbor_allreduce) ", line)]
    reached = [row for row in rows if re.search(r" \d/\d ", row)]
    assert reached and all(" 1.5M " in row for row in reached), rows
    code, out, err = run_report([tmp_path], "json")
    detail = [run for group in json.loads(out)["accuracy_groups"] for row in group["rows"]
              for run in row["runs_detail"] if run["reached"] is False]
    assert detail and all(run["bytes_to_target"] is None for run in detail)
    # the chart spells sizes as the report does (binary units, no decimal "MB")
    groups = accuracy.group(reader.read([tmp_path])[0]["accuracy"])
    group = next(g for g in groups if g.key.target)
    fig = accuracy_charts.time_figure(group, accuracy_charts.palette(groups))
    words = [t.get_text() for t in fig.axes[0].texts]
    assert words and all("1.5M sent per worker" in w for w in words if "0/" not in w), words
    assert "1G = 2^30 bytes" in fig.axes[0].get_xlabel()
