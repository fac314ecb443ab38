"""--recovery gossip (commbench.faults.gossip_recovery): what is refused in one line, and
through mpiexec, four ranks of neighbor_allreduce trained to accuracy that lose one,
killed by --fail, and go on around it to the run's planned end, with what the failure
cost in the result and their consensus back below its level before the failure. That
every mixing step after a loss keeps the survivors' mean, against a dense reference, is
tests/test_gossip_survival.py's (the same schedule, commbench.topology.survivors)."""

import copy
import json
from pathlib import Path

import pytest

from analysis_helpers import run_report
from cli_helpers import commbench, refused
from commbench.faults import gossip_costs
from commbench.timing import failure_track
from launchers import PYTHON, mpiexec_path, only_result, run
from test_accuracy_analysis import fixture, write_run
from test_training_to_accuracy import TINY_TASK

# 2 steps per epoch on each of 4 workers: 16 steps, evaluated every 4.
TINY = [*TINY_TASK, "--max-epochs", "8", "--eval-every", "4"]
GOSSIP = ["--dist-optimizer", "neighbor_allreduce", "--recovery", "gossip", "--cpu-transport",
          "gloo"]
DATA = Path(__file__).parent / "data"
MPIEXEC = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}


@pytest.mark.parametrize("args, message", [
    (["--dist-optimizer", "allreduce"], "argument --recovery: gossip needs a strategy that "
     "averages with neighbors, --dist-optimizer neighbor_allreduce or "
     "hierarchical_neighbor_allreduce; allreduce cannot go on "
     "around a lost rank"),
    (["--cpu-transport", "mpi"], "argument --recovery: gossip's survivors wait on each "
     "message through gloo"),
    (["--fail", "0@step3"], "argument --fail: rank 0 serves the store gossip's survivors meet "
     "in and never fails under --recovery gossip; fail another rank"),
])
def test_a_gossip_recovery_it_cannot_make_is_refused_in_one_line(args, message, tmp_path):
    done = commbench("run", *TINY, *GOSSIP, *args, "--results-dir", tmp_path, env=MPIEXEC)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("commbench: error: " + message)


def test_gossip_needs_an_mpi_launcher_and_a_run_trained_to_accuracy():
    assert refused("run", *TINY, *GOSSIP).startswith(
        "commbench: error: argument --recovery: gossip needs an MPI launcher that keeps the "
        "others running when a rank dies: mpiexec --enable-recovery")
    assert refused("run", *GOSSIP).startswith(
        "commbench: error: argument --recovery: a speed run times its steps, and gossip's "
        "survivors would change the world size it times")


def test_report_says_what_a_gossip_runs_failures_cost(tmp_path):
    path, doc = fixture("neighbor_allreduce", 42)
    doc = copy.deepcopy(doc)
    doc["recovery"] = {"policy": "gossip", "survivors": [0, 1, 3], "wall_seconds": 15.0,
                       "goodput": 116.4, "costs": [{
                           "event": "2@step8:kill", "rank": 2, "failed_after_step": 7,
                           "failed_at": 1.0, "detection_seconds": 0.4,
                           "recovery_seconds": 2.2, "rejoin_seconds": None,
                           "resumed_at_exchange": 8, "steps_with_fewer_workers": 9,
                           "samples_lost": 288}]}
    written = write_run(tmp_path, path.name, doc)
    code, text, err = run_report([tmp_path])
    assert code == 0 and err == "", err
    lines = [li for li in text.splitlines() if "--recovery gossip" in li]
    assert len(lines) == 1 and lines[0].endswith(
        ", seed 42: --recovery gossip, 3 survivors; goodput 116.4 img/sec over 15.0 s of "
        "wall time; 2@step8:kill: detected after 0.4 s, 2.2 s to the first exchange among "
        f"the survivors, 9 steps with fewer workers; {written}"), lines


def test_report_and_console_say_when_a_lost_rank_rejoined(tmp_path):
    path, doc = fixture("neighbor_allreduce", 42)
    doc = copy.deepcopy(doc)
    cost = {"event": "2@step8:kill+5s", "rank": 2, "failed_after_step": 7, "failed_at": 1.0,
            "detection_seconds": 0.4, "recovery_seconds": 2.2, "rejoin_seconds": 11.3,
            "rejoined_at_step": 20, "resumed_at_exchange": 8, "steps_with_fewer_workers": 13,
            "samples_lost": 416}
    doc["recovery"] = {"policy": "gossip", "survivors": [0, 1, 2, 3], "rejoined": [2],
                       "wall_seconds": 15.0, "goodput": 116.4, "costs": [cost]}
    write_run(tmp_path, path.name, doc)
    code, text, err = run_report([tmp_path])
    assert code == 0 and err == "", err
    (line,) = [li for li in text.splitlines() if "--recovery gossip" in li]
    assert ": --recovery gossip, 4 survivors, 1 rejoined; goodput 116.4 img/sec over 15.0 s " \
        "of wall time; 2@step8:kill+5s: detected after 0.4 s, 2.2 s to the first exchange " \
        "among the survivors, 13 steps with fewer workers, rejoined after 11.3 s; " in line
    assert gossip_costs.lines(doc["recovery"], None, "images")[0] == (
        "Failure 2@step8:kill+5s: detected after 0.4 s, first exchange among the survivors "
        "2.2 s after it; rejoined 11.3 s after it, at step 20; 13 steps with fewer workers "
        "(416 images not learnt from)")


def test_the_steps_with_fewer_workers_end_at_the_rejoin():
    assert gossip_costs.fewer(60, 7, None) == 53
    assert gossip_costs.fewer(60, 7, 20) == 13
    assert gossip_costs.fewer(16, 7, 20) == 9  # the run ended before the rejoin


def test_report_gives_a_language_models_goodput_in_tokens(tmp_path):
    path = sorted((DATA / "lm-loss").glob("*.json"))[0]
    doc = json.loads(path.read_text())
    doc["recovery"] = {"policy": "gossip", "survivors": [0], "wall_seconds": 10.0,
                       "goodput": 900.0, "costs": []}
    write_run(tmp_path, path.name, doc)
    code, text, err = run_report([tmp_path])
    assert code == 0 and err == "", err
    line = next(li for li in text.splitlines() if "--recovery gossip" in li)
    assert ", N=2, seed " in line and \
        ": --recovery gossip, 1 survivor; goodput 900.0 tokens/sec over 10.0 s" in line, line


def test_the_console_says_what_each_failure_cost_and_the_goodput():
    facts = {"survivors": [0], "goodput": 46.25, "wall_seconds": 23.5, "costs": [
        {"event": "1@step4:kill", "detection_seconds": 0.4, "recovery_seconds": 3.4,
         "steps_with_fewer_workers": 13, "samples_lost": 416},
        {"event": "3@step6:stop", "detection_seconds": 6.1, "recovery_seconds": None,
         "steps_with_fewer_workers": 11, "samples_lost": 352}]}
    assert gossip_costs.lines(facts, 68.3, "images") == [
        "Failure 1@step4:kill: detected after 0.4 s, first exchange among the survivors 3.4 "
        "s after it; 13 steps with fewer workers (416 images not learnt from)",
        "Failure 3@step6:stop: detected after 6.1 s, first exchange among the survivors not "
        "seen; 11 steps with fewer workers (352 images not learnt from)",
        "Goodput: 46.2 images/sec over 23.5 s of wall time, 1 survivor, failures included "
        "(during training: 68.3)"]


def test_the_timeline_numbers_the_survivors_as_the_job_started_them():
    events, offsets, names = failure_track.as_started(
        [0, 1, 3], [["a"], ["b"], ["d"]], [0.0, 0.5, 0.25], ["h0", "h1", "h3"])
    assert events == [["a"], ["b"], [], ["d"]]
    assert offsets == [0.0, 0.5, 0.0, 0.25]
    assert names == ["rank 0 (h0)", "rank 1 (h1)", "rank 2 (lost)", "rank 3 (h3)"]


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_survivors_of_a_killed_rank_train_on_to_the_planned_end(tmp_path):
    """Rank 2 killed as its 8th step begins: the others find it, meet, mix around it and
    train the 16 steps; the front's --enable-recovery is given by hand, as mpiexec here
    may be Open MPI's own."""
    trace = tmp_path / "timeline" / "trace.json"
    trace.parent.mkdir()
    cmd = [mpiexec_path(), "-n", "4", "--oversubscribe", "--bind-to", "none",
           "--enable-recovery", PYTHON, "-m", "commbench", *TINY, *GOSSIP, "--fail", "2@step8",
           "--timeout", "10", "--results-dir", str(tmp_path), "--timeline", str(trace)]
    done = run(cmd, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    summary, recovery = doc["summary"], doc["recovery"]
    assert (summary["steps"], summary["stopped_by"]) == (16, "max epochs")
    assert recovery["survivors"] == [0, 1, 3]
    crowded = summary["oversubscribed"]  # as the job started, not as the survivors ended
    assert crowded is None or crowded["workers"] == 4, crowded
    (cost,) = recovery["costs"]
    assert (cost["rank"], cost["failed_after_step"]) == (2, 7)
    assert 0 < cost["detection_seconds"] <= cost["recovery_seconds"] < 10
    assert cost["steps_with_fewer_workers"] == 16 - 7
    assert cost["samples_lost"] == 9 * 32
    curve = doc["curve"]
    assert curve[-1]["samples"] == 16 * 32 * 4 - 9 * 32  # the lost rank's steps not counted
    before = [p for p in curve if p["step"] <= 7][-1]["consensus_distance"]
    assert curve[-1]["consensus_distance"] < before
    # the timeline numbers the ranks as the job started them, the failure on rank 2's
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[2] == "rank 2 (lost)" and names[3].startswith("rank 3 (")
    assert {e["pid"] for e in events if e.get("cat") == "failure"} == {2}
