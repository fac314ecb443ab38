"""A run whose loss went non-finite is still recorded (strict JSON, flagged with the
step it diverged at), a timeline that cannot be written never costs the result, and a
disk that fills during the run costs the file, never the numbers printed before it."""

import errno
import json
import math
import os
import re
import subprocess

import pytest

from cli_helpers import commbench
from commbench.job import per_iteration
from commbench.result import record, store
from commbench.timing import trace_file
from commbench.config.run_config import RunConfig
from commbench.job.speed_loop import LossWatch
from commbench.errors import NotRecorded
from fault_plugins import FILL
from launchers import PYTHON, TINY_RUN, mpiexec, only_result, run


def strict(text):
    """json.loads that refuses NaN and Infinity, as strict JSON readers do."""
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_strict_json_and_read_back(tmp_path):
    doc = store.new_document("run")
    doc.update(config={"model": "NaN"}, summary={"final_loss": math.nan, "diverged": None},
               samples={"loss": [[1.0, math.inf], [-math.inf, 2.0]]})
    path = store.write_result(tmp_path, doc, "diverged")
    on_disk = strict(path.read_text())
    assert on_disk["summary"]["final_loss"] == "NaN"
    assert on_disk["samples"]["loss"] == [[1.0, "Infinity"], ["-Infinity", 2.0]]
    back = store.read_result(path)
    assert math.isnan(back["summary"]["final_loss"])
    assert back["samples"]["loss"] == [[1.0, math.inf], [-math.inf, 2.0]]
    assert back["config"]["model"] == "NaN"  # what the user typed is never decoded


@pytest.mark.parametrize("version", [None, "1", True, 0, 1.5])
def test_a_schema_version_that_is_not_a_whole_number_is_malformed(tmp_path, version):
    doc = {"format": store.FORMAT, "status": "ok", "config": {}, "summary": {}}
    if version is not None:
        doc["schema_version"] = version
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="malformed: its schema_version"):
        store.read_result(path)


def test_the_loss_watch_counts_warm_up_and_finds_the_first_non_finite_step():
    import torch

    watch = LossWatch()
    for value in (1.0, 2.0, math.nan, 3.0, math.inf):
        watch.see(torch.tensor(value))
    assert (watch.steps, watch.first_non_finite) == (5, 3)


def test_divergence_is_the_earliest_step_over_ranks():
    assert per_iteration.diverged([None, None]) is None
    assert per_iteration.diverged([7, None, 4, 4]) == {"step": 4, "rank": 2}


def test_a_timeline_that_cannot_be_written_leaves_the_result_written(tmp_path):
    taken = tmp_path / "trace.json"
    taken.write_text("someone else's file")  # appeared at the trace's path during the run
    config = RunConfig(results_dir=str(tmp_path / "results"), timeline=str(taken))
    (tmp_path / "results").mkdir()
    doc = store.new_document("run")
    doc.update(config=config.to_dict(), summary={})
    written = record.write(config, doc, "stem", events=[[]], hosts=["h"],
                           clocks={"seconds": [0.0], "uncertainty": [0.0]})
    assert written.path.exists() and store.read_result(written.path)["kind"] == "run"
    assert str(taken) in written.timeline_error and "exists" in written.timeline_error
    assert taken.read_text() == "someone else's file"


def test_a_timeline_folder_that_cannot_be_written_is_refused_at_start_up():
    # Root's permission bits allow /sys, but no file can be made there.
    if not os.path.isdir("/sys") or os.access("/sys", os.W_OK) is False:
        pytest.skip("needs /sys, writable by its permission bits alone (root)")
    with pytest.raises(OSError, match="cannot write to /sys"):
        trace_file.check_writable("/sys/commbench-trace.json")


def test_an_unwritable_timeline_is_one_line_before_the_run(tmp_path):
    done = commbench("--timeline", "/sys/trace.json", "--results-dir", str(tmp_path), *TINY_RUN)
    assert done.returncode == 2
    assert "argument --timeline: cannot write to /sys" in done.stderr
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("*.json"))


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_a_diverged_speed_run_keeps_its_img_sec_and_says_where(tmp_path):
    done = mpiexec(2, ["-m", "commbench", "--dist-optimizer", "allreduce", "--lr", "1e30",
                       "--results-dir", str(tmp_path), *TINY_RUN], timeout=200)
    assert done.returncode == 0, done.stderr[-2000:]
    strict(next(tmp_path.glob("*.json")).read_text())
    doc = only_result(tmp_path)
    summary = doc["summary"]
    assert summary["diverged"]["step"] >= 1 and summary["diverged"]["rank"] in (0, 1)
    assert summary["final_loss"] == "NaN"
    assert summary["total_img_sec"]["mean"] > 0
    assert f"Diverged at step {summary['diverged']['step']}" in done.stdout
    assert "Result: " in done.stdout and "Traceback" not in done.stderr


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_a_diverged_accuracy_run_stops_at_its_next_evaluation_not_reached(tmp_path):
    done = run([PYTHON, "-m", "commbench", "--dist-optimizer", "none", "--lr", "1e30",
                "--data", "learnable", "--target-accuracy", "0.8", "--eval-every", "3",
                "--model", "resnet18", "--image-size", "32", "--batch-size", "8",
                "--results-dir", str(tmp_path)], timeout=200)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = only_result(tmp_path)["summary"]
    assert (summary["reached"], summary["stopped_by"], summary["steps"]) == \
        (False, "diverged", 3)
    assert 1 <= summary["diverged"]["step"] <= 3
    assert "Target 0.8 not reached: diverged" in done.stdout


def test_a_result_that_meets_a_full_disk_names_its_file_and_leaves_no_part(tmp_path,
                                                                           monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store.os, "fsync", full)
    with pytest.raises(NotRecorded) as caught:
        store.write_result(tmp_path, store.new_document("run"), "stem")
    line = str(caught.value)
    assert re.fullmatch(rf"the result was not written to {re.escape(str(tmp_path))}/\S+"
                        r"-stem-\w+\.json: No space left on device; the numbers printed "
                        "above are all that is left of it", line), line
    assert list(tmp_path.iterdir()) == []  # no temp file, no part of a result


@pytest.mark.job
@pytest.mark.timeout(240)
def test_a_disk_that_fills_during_the_run_keeps_the_numbers_on_the_console(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    # 20 MiB: start-up wants 16 MiB free (store.MIN_FREE_BYTES); the run fills the rest.
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        tests = os.path.dirname(os.path.abspath(__file__))
        done = run([PYTHON, "-m", "commbench", "--dist-optimizer=fault_plugins:FillsTheDisk",
                    *TINY_RUN, "--results-dir", str(disk / "results")], timeout=200,
                   env={"PYTHONPATH": tests, FILL: str(disk)})
        left = sorted(p.name for p in (disk / "results").iterdir())
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Total img/sec on 1 " in done.stdout and "Result:" not in done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"commbench: error: the result was not written to {disk / 'results'}/")
    assert done.stderr.rstrip().endswith("No space left on device; the numbers printed "
                                         "above are all that is left of it")
    assert "Traceback" not in done.stderr and left == []
