"""`commbench compare` on the committed fixture arms (runs/ under mpiexec, runs-new/
under torchrun with --tag new), and on arms made slower on purpose."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis_helpers import run_compare
from commbench.result import metrics

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
RUNS, NEW, JUNK, GOLDEN = DATA / "runs", DATA / "runs-new", DATA / "junk", DATA / "golden"


def slowed_copy(source: Path, target: Path, factor: float) -> Path:
    """A copy of an arm whose every iteration took `factor` times as long."""
    target.mkdir()
    for path in source.glob("*.json"):
        doc = json.loads(path.read_text())
        doc["samples"]["iteration_seconds"] = [[t * factor for t in rank]
                                               for rank in doc["samples"]["iteration_seconds"]]
        for key in ("total_img_sec", "img_sec_per_worker"):
            stats = doc["summary"][key]
            stats.update({k: stats[k] / factor for k in ("mean", "spread", "ci95") if stats[k]})
        (target / path.name).write_text(json.dumps(doc))
    return target


def test_compare_matches_the_golden_output(monkeypatch):
    monkeypatch.chdir(REPO)  # the output names files by the paths given
    code, out, err = run_compare("tests/data/runs", "tests/data/runs-new")
    assert code == 0 and err == ""
    assert out == (GOLDEN / "compare.txt").read_text()


def test_unmatched_runs_and_environment_differences_are_listed():
    _, text, _ = run_compare(RUNS, NEW)
    assert "Welch's t-test" in text
    only_base = text.split("Only in BASE")[1].split("\n\n")[0]
    only_new = text.split("Only in NEW")[1].split("\n\n")[0]
    assert "    none, N=1: " in only_base and "    none, N=4: " in only_base
    assert "    allreduce, " not in only_base
    assert "fp16-allreduce" in only_new
    assert "launcher: openmpi -> torchrun" in text
    assert 'tag: "" -> new' in text


def test_a_significant_slowdown_fails_only_when_asked(tmp_path):
    slow = slowed_copy(RUNS, tmp_path / "slow", 2.0)
    code, out, _ = run_compare(RUNS, slow)
    assert code == 0 and "SLOWER" in out and "-50.0%" in out
    assert run_compare(RUNS, slow, fail_on_regression=True)[0] == 1
    assert run_compare(slow, RUNS, fail_on_regression=True)[0] == 0  # faster is no failure
    # beyond the threshold nothing has "changed", however significant
    code, out, _ = run_compare(RUNS, slow, threshold=0.6, fail_on_regression=True)
    assert code == 0 and "SLOWER" not in out and "below 60%" in out


def test_an_arm_compared_with_itself_is_unchanged():
    code, out, _ = run_compare(RUNS, RUNS, fail_on_regression=True)
    assert code == 0 and "SLOWER" not in out and "faster" not in out.split("compared:")[0]
    assert "ratio" in out and "Only in" not in out
    assert "Environment differences (BASE -> NEW; a | b: the arm's runs differ):\n  none" in out


def test_json_output_and_junk_in_an_arm(tmp_path):
    arm = tmp_path / "arm"
    shutil.copytree(NEW, arm)
    for path in JUNK.iterdir():
        shutil.copy(path, arm)
    code, out, err = run_compare(RUNS, arm, fmt="json")
    doc = json.loads(out)
    assert code == 0 and len(err.splitlines()) == 5
    assert doc["test"].startswith("Welch") and doc["threshold"] == 0.05
    assert len(doc["pairs"]) == 5 and len(doc["only_in_base"]) == 6
    assert doc["environment_differences"]["launcher"] == [["openmpi"], ["torchrun"]]


def test_an_arm_without_results_is_an_error():
    code, out, err = run_compare(RUNS, JUNK)
    assert code == 1 and "no usable commbench run results in NEW" in err


def test_welch_p_value():
    assert metrics.welch_p_value([1.0], [1.0, 2.0]) is None
    assert metrics.welch_p_value([5, 5, 5], [5, 5, 5]) == 1.0
    assert metrics.welch_p_value([5, 5, 5], [6, 6, 6]) == 0.0
    assert metrics.welch_p_value([10, 11, 10.5], [20, 21, 20.5]) < 0.001
    assert metrics.welch_p_value([10, 12, 11], [10.5, 11.5, 11]) > 0.5


@pytest.mark.job
def test_command_line():
    proc = subprocess.run([sys.executable, "-m", "commbench", "compare", "--fail-on-regression",
                           "--threshold", "1000", "tests/data/runs", "tests/data/runs-new"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "|delta| >= 1000%" in proc.stdout


@pytest.mark.parametrize("fmt", ["markdown"])
def test_markdown(fmt):
    code, out, _ = run_compare(RUNS, NEW, fmt=fmt)
    assert code == 0 and "| strategy |" in out and out.count("## ") >= 3
