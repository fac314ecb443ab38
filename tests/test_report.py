"""`commbench report` on the committed fixture runs, against golden output
(regenerate with: bash tests/data/make_fixtures.sh --golden)."""

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis_helpers import run_report

DATA = Path(__file__).parent / "data"
RUNS, JUNK, GOLDEN = DATA / "runs", DATA / "junk", DATA / "golden"


@pytest.mark.parametrize("fmt, golden", [("text", "report.txt"), ("markdown", "report.md")])
def test_report_matches_the_golden_output(fmt, golden):
    code, out, err = run_report([RUNS], fmt)
    assert code == 0 and err == ""
    assert out == (GOLDEN / golden).read_text()


def test_report_says_which_efficiency_is_which():
    _, text, _ = run_report([RUNS])
    assert "E(N) = Total(N) / (N x Total(1))" in text
    assert "E* = Total / the workers' compute-only rate" in text
    assert "Total(1) is the same strategy's" in text
    assert "Total(1), each strategy's own 1-worker runs: allreduce " in text


def test_csv_has_one_row_per_configuration_and_raw_numbers():
    code, out, _ = run_report([RUNS], "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    # allreduce and none at 1, 2, 4 workers; neighbor_allreduce (2 topologies) at 2, 4;
    # hierarchical at 4
    assert code == 0 and len(rows) == 11
    repeated = [r for r in rows if r["runs"] == "2"]
    assert len(repeated) == 1 and repeated[0]["ci95_over"] == "runs"
    one = next(r for r in rows if r["workers"] == "1" and r["strategy"] == "allreduce")
    assert float(one["total_img_sec"]) > 0 and one["model"] == "resnet18"
    assert one["efficiency_in_job"] and float(one["efficiency"]) > 0


def test_json_lists_the_files_behind_every_row():
    code, out, _ = run_report([RUNS], "json")
    doc = json.loads(out)
    rows = doc["groups"][0]["rows"]
    files = {f for row in rows for f in row["files"]}
    assert code == 0 and len(files) == len(list(RUNS.glob("*.json")))
    baselines = doc["groups"][0]["baselines"]
    assert baselines["allreduce"]["runs"] == 1 and baselines["allreduce"]["from"] == "allreduce"
    assert baselines["neighbor_allreduce (ring, static, AWC)"]["from"] == "none"
    rows = {(r["strategy"], r["workers"]): r for r in rows}
    assert rows[("none", 4)]["oversubscribed"] is True
    assert "oversubscribed" in rows[("none", 4)]["flags"]


def test_junk_is_skipped_one_warning_line_each_and_the_rest_reported():
    code, out, err = run_report([RUNS, JUNK])
    assert code == 0
    assert out == (GOLDEN / "report.txt").read_text()
    assert len(err.splitlines()) == 5 and all("skipping" in line for line in err.splitlines())


def test_nothing_usable_is_a_clear_error():
    code, out, err = run_report([JUNK])
    assert code == 1 and out == ""
    assert "error: no usable commbench run results" in err.splitlines()[-1]


@pytest.mark.job
def test_command_line(tmp_path):
    target = tmp_path / "report.md"
    proc = subprocess.run([sys.executable, "-m", "commbench", "report", "--format", "markdown",
                           "-o", str(target), str(RUNS), str(JUNK)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert target.read_text() == (GOLDEN / "report.md").read_text()
    assert len(proc.stderr.splitlines()) == 5


def test_a_list_of_files_reports_like_their_directory():
    # how `commbench sweep` calls it: with exactly the files it made
    code, out, _ = run_report(sorted(RUNS.glob("*.json")))
    assert code == 0 and out == (GOLDEN / "report.txt").read_text()


@pytest.mark.parametrize("fixture, label", [
    (RUNS / "20261122T145426-resnet18-allreduce-n2-9d4aee5d.json", "allreduce"),
    (DATA / "accuracy" / "target" /
     "20261125T085948-resnet18-allreduce-n2-accuracy-1dea79cd.json", "allreduce"),
])
def test_a_run_that_communicated_and_counted_no_bytes_is_named_in_one_line(tmp_path, fixture,
                                                                           label):
    """summary.wire_unrecorded (commbench.result.record), in a speed or an accuracy result: the
    run is named with its file, so its 0 bytes on the wire are not read as what it sent."""
    from cli_helpers import commbench
    from commbench.result import store

    doc = store.read_result(fixture)
    doc["summary"]["wire_unrecorded"] = True
    flagged = tmp_path / fixture.name
    flagged.write_text(store.to_json(doc))
    done = commbench("report", tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    lines = [line for line in done.stdout.splitlines() if "No bytes on the wire" in line]
    assert lines == [f"No bytes on the wire recorded: {label}, N=2, {flagged}: its strategy "
                     'communicates but counted none (docs/plugins.md, "Bytes on the wire"); '
                     "its 0 bytes are not what it sent"]
