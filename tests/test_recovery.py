"""--recovery restart (commbench.faults.recovery, restart, checkpoint, supervise): what is
refused in one line, checkpoints saved and found (a cut-short or damaged one ignored
with a line), what a failure cost from its records; and through real launchers, a job
killed mid-run by --fail that torchrun's elastic agent or `commbench supervise` around
mpiexec starts again, which resumes from its checkpoint and ends with the model a run
without a failure ends with, bit for bit."""

import copy
import json
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis_helpers import run_report
from cli_helpers import commbench, refused
from commbench.config.run_config import RunConfig
from commbench.faults import checkpoint, fail_inject, fail_schedule, restart
from commbench.faults.recovery_hook import Progress
from commbench.errors import UsageError
from launchers import PYTHON, mpiexec_path, only_result, run, torchrun
from test_accuracy_analysis import TARGET, fixture, write_run
from test_training_to_accuracy import TINY_TASK

# 5 steps per epoch on each of 2 workers: 10 steps, evaluated at 5 and 10, checkpoints
# at 3, 6 and 9. The gloo transport under both launchers, so that both sum alike.
TINY = [*TINY_TASK, "--max-epochs", "2", "--eval-every", "5", "--cpu-transport", "gloo"]
RESTART = ["--recovery", "restart", "--checkpoint-every", "3"]
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0"}
RESTARTS = {**TORCHRUN, "TORCHELASTIC_MAX_RESTARTS": "1"}


@pytest.mark.parametrize("args, message", [
    (["--checkpoint-every", "3"], "argument --checkpoint-every: checkpoints are taken for "
     "--recovery restart alone: leave it out"),
    (["--checkpoint-dir", "x"], "argument --checkpoint-dir: checkpoints are taken for "),
    (["--recovery", "restart"], "argument --recovery: a speed run times its steps, and a "
     "restart would time the steps it redoes"),
])
def test_flags_nothing_would_read_are_refused_in_one_line(args, message):
    assert refused("run", *args).startswith("commbench: error: " + message)


@pytest.mark.parametrize("env, args, message", [
    (TORCHRUN, [], "argument --recovery: restart needs torchrun to start the workers again "
     "after a failure: torchrun --max-restarts N (N >= 1)"),
    ({**TORCHRUN, "TORCHELASTIC_MAX_RESTARTS": "0"}, [], "argument --recovery: restart needs "
     "torchrun to start"),
    ({}, [], "argument --recovery: restart needs something to start the job again after a "
     "failure: `commbench supervise --restarts N -- mpiexec ...`"),
    (RESTARTS, ["--fail", "1@step3,1@step6"], "argument --fail: 2 failures, but the "
     "launcher starts the job again 1 time at most"),
    (RESTARTS, ["--dist-optimizer", "local_sgd"], "argument --recovery: local_sgd keeps "
     "state of its own between steps"),
    (RESTARTS, ["--compression", "powersgd:1"], "argument --recovery: PowerSGD's error "
     "feedback is state of its own"),
])
def test_a_restart_nothing_would_start_or_resume_exactly_is_refused(env, args, message,
                                                                    tmp_path):
    if "powersgd:1" in args:
        needs_dcp()  # an older torch refuses PowerSGD itself first
    done = commbench("run", *TINY, *RESTART, *args, "--results-dir", tmp_path, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("commbench: error: " + message), lines[0]


def needs_dcp():
    """Skip where torch has no torch.distributed.checkpoint state-dict API (before 2.2,
    e.g. the Bluefog environment's torch 1.10): --recovery restart is refused there."""
    pytest.importorskip("torch.distributed.checkpoint.state_dict",
                        reason="--recovery restart needs torch >= 2.2")


def test_a_restart_on_a_torch_without_dcp_is_refused_in_one_line(monkeypatch):
    from commbench import registry
    from commbench.faults import recovery
    from commbench.launch.detect import LaunchInfo

    monkeypatch.setattr(recovery, "torch_older_than", lambda major, minor: True)
    monkeypatch.setenv(recovery.SUPERVISED, "1")
    config = RunConfig(recovery="restart", checkpoint_every=3, target_accuracy=0.5,
                       data="learnable")
    with pytest.raises(UsageError, match="^argument --recovery: restart checkpoints through "
                       "torch.distributed.checkpoint's state-dict API, which needs torch "
                       ">= 2.2"):
        recovery.check(config, LaunchInfo("openmpi", 0, 2, 0, 2, 0),
                       registry.resolve("allreduce"))


def test_a_restarting_job_may_fail_a_rank_twice_and_rejoin():
    fail_schedule.check("1@step6+2s,1@step9", 2, restarts=True)
    with pytest.raises(UsageError, match="rejoins, but there is nothing to rejoin"):
        fail_schedule.check("1@step6+2s", 2)


def tiny_model(seed):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process saves
def test_a_checkpoint_reads_back_and_a_cut_short_or_damaged_one_is_ignored_with_a_line(
        tmp_path):
    needs_dcp()
    model, optimizer = tiny_model(1)
    checkpoint.save(tmp_path, 3, model, optimizer, 0, {"steps": 3})
    (tmp_path / "step-00000006.partial").mkdir()
    (tmp_path / "step-00000009").mkdir()
    (tmp_path / "step-00000009" / ".metadata").write_bytes(b"not a checkpoint")
    said = []
    assert checkpoint.newest_readable(tmp_path, said.append) == (3, tmp_path / "step-00000003")
    assert len(said) == 2, said
    assert said[0] == (f"Warning: checkpoint {tmp_path}/step-00000006.partial was cut short "
                       "before it was complete; ignored")
    assert said[1].startswith(f"Warning: checkpoint {tmp_path}/step-00000009 cannot be read (")
    assert said[1].endswith("); ignored") and "\n" not in said[1]
    assert not (tmp_path / "step-00000006.partial").exists()  # its step can be saved again

    fresh, fresh_optimizer = tiny_model(2)
    assert checkpoint.digest(fresh) != checkpoint.digest(model)
    assert checkpoint.load(tmp_path / "step-00000003", fresh, fresh_optimizer, 0) == {"steps": 3}
    assert checkpoint.digest(fresh) == checkpoint.digest(model)
    assert fresh_optimizer.state_dict()["state"][0]["momentum_buffer"].equal(
        optimizer.state_dict()["state"][0]["momentum_buffer"])


def test_a_rank_that_ends_the_job_records_when_it_noticed(tmp_path, monkeypatch, capsys):
    from commbench.job import failure

    monkeypatch.setattr(failure, "on_failure", None)
    monkeypatch.setattr(failure, "launcher_first", lambda error: 0.0)
    monkeypatch.setattr(failure, "_abort", lambda code: None)
    config = RunConfig(fail="1@step6", recovery="restart", checkpoint_dir=str(tmp_path))
    job = restart.Restart(config, SimpleNamespace(world_size=2, rank=1), print)
    failure.describe_and_abort(RuntimeError("peer gone"))  # no job directory yet: no record
    job.dir.mkdir(parents=True)
    before = time.time()
    for _ in range(2):
        failure.describe_and_abort(RuntimeError("Connection closed by peer"))
    noticed = restart.read(job.dir / "noticed-1.record")
    assert len(noticed) == 2 and before <= noticed[0] <= noticed[1] <= time.time()
    assert capsys.readouterr().err.count("commbench: error: ") == 3
    job.fired(job.events[0], 5)  # the failing rank's own notices are not a survivor's
    failure.describe_and_abort(RuntimeError("Connection closed by peer"))
    assert restart.read(job.dir / "noticed-1.record") == noticed


def test_what_a_failure_cost_is_read_from_its_records(tmp_path):
    config = RunConfig(fail="1@step6,1@step9", recovery="restart", checkpoint_every=3,
                       checkpoint_dir=str(tmp_path), batch_size=32)
    ctx = SimpleNamespace(world_size=2, rank=0)
    job = restart.Restart(config, ctx, print)
    # a language model's goodput counts tokens, as its throughput does
    assert restart.Restart(replace(config, model="lm-tiny", seq_len=16, batch_size=4), ctx,
                           print).samples_per_step == 4 * 16 * 2
    job.dir.mkdir(parents=True)
    now = time.time()
    # the second attempt failed again (event 1) before its first step: the third
    # recovered from both
    restart.write(job.dir / "starts.record", [now - 100, now - 50, now - 30])
    restart.write(job.dir / "fired-0.record", {"event": "1@step6:kill", "rank": 1, "steps": 5,
                                               "at": now - 60})
    restart.write(job.dir / "fired-1.record", {"event": "1@step9:kill", "rank": 1, "steps": 3,
                                               "at": now - 45})
    for index in range(2):
        restart.write(job.dir / f"recovered-{index}.record", {
            "detected": now - 30, "resumed_from": 3, "recovered": now - 25})
    # detected when the first survivor noticed it, not before it fired nor after the first
    # restart after it
    restart.write(job.dir / "noticed-0.record", [now - 70, now - 59.5])
    restart.write(job.dir / "noticed-1.record", [now - 59.9])  # the failing rank's own
    restart.write(job.dir / "noticed-2.record", [now - 58, now - 40])
    first = {"event": "1@step6:kill", "rank": 1, "failed_after_step": 5, "failed_at": now - 60,
             "detection_seconds": pytest.approx(0.5), "restart_seconds": pytest.approx(10),
             "recovery_seconds": pytest.approx(35), "resumed_from_step": 3, "steps_lost": 2,
             "samples_lost": 128}
    second = {"event": "1@step9:kill", "rank": 1, "failed_after_step": 3, "failed_at": now - 45,
              "detection_seconds": pytest.approx(5), "restart_seconds": pytest.approx(15),
              "recovery_seconds": pytest.approx(20), "resumed_from_step": 3, "steps_lost": 0,
              "samples_lost": 0}
    assert [job._cost(0), job._cost(1)] == [first, second]
    assert restart.cost_lines({"costs": [job._cost(0)], "restarts": 1, "goodput": 1.0,
                               "wall_seconds": 1.0}, None, "images")[0] == (
        "Failure 1@step6:kill: detected after 0.5 s, its launcher ended it after 10.0 s, "
        "first complete step 35.0 s after it; resumed from step 3, 2 steps (128 images) "
        "redone")
    # where no survivor noticed it before the launcher ended them: the restart
    for noticed in job.dir.glob("noticed-*"):
        noticed.unlink()
    facts = job.facts({"steps": 10, "reached": True}, tiny_model(1)[0])
    assert facts["costs"] == [{**first, "detection_seconds": pytest.approx(10)},
                              {**second, "detection_seconds": pytest.approx(15)}]
    # from the first start, however long the test itself took (a loaded box)
    assert facts["restarts"] == 2 and 100 <= facts["wall_seconds"] <= time.time() - now + 100
    assert facts["goodput"] == pytest.approx(640 / facts["wall_seconds"])
    assert facts["wall_time_to_target"] == facts["wall_seconds"]
    assert not job.dir.exists()  # retired: the same command run again starts afresh
    assert [p.name.split(".")[0] for p in tmp_path.iterdir()] == [job.dir.name]


class Died(Exception):
    """The stand-in for the signal: the test process survives the kill."""


def test_a_fired_event_is_recorded_before_the_rank_dies_and_never_fires_again(tmp_path):
    needs_dcp()
    config = RunConfig(fail="1@step6+30s", recovery="restart", checkpoint_every=3,
                       checkpoint_dir=str(tmp_path))
    job = restart.Restart(config, SimpleNamespace(world_size=2, rank=1), print)
    job.dir.mkdir(parents=True)

    def die(sig):
        raise Died(sig)

    inject = fail_inject.Injector(job.events, 1, config.fail, 10.0, die=die)
    inject.record = job.fired
    step = inject.around(lambda: None)
    job.progress = Progress(5, bytes_sent=5000)  # as the loop tells it after step 5
    with pytest.raises(Died):
        for _ in range(6):
            step()
    fired = restart.read(job.dir / "fired-0.record")
    assert (fired["event"], fired["rank"], fired["steps"]) == ("1@step6:kill+30s", 1, 5)
    assert fired["at"] == pytest.approx(time.time(), abs=5)
    # the job started again: rank 0 finds it fired, not yet recovered, and the rejoin's
    # wait counted from the failure; the attempt that failed had sent 5 steps' bytes
    job.rank = 0
    found, done, pending, wait, sent = job._plan()
    assert found is None and done == pending == [0] and 25 < wait <= 30 and sent == 5000
    again = fail_inject.Injector(job.events, 1, config.fail, 10.0, die=die)
    again.forget([job.events[i] for i in done])
    again.resume_at(3, 1.0)
    step = again.around(lambda: None)
    for _ in range(10):
        step()  # past step 6: never fired again


def test_report_says_a_restarted_runs_goodput_and_what_its_failures_cost(tmp_path):
    path, doc = fixture("allreduce", 42)
    doc = copy.deepcopy(doc)
    doc["recovery"] = {
        "policy": "restart", "checkpoint_every": 3, "restarts": 1, "wall_seconds": 50.0,
        "goodput": 12.75, "wall_time_to_target": 50.0, "final_model_sha256": "0" * 64,
        "costs": [{"event": "1@step6:kill", "rank": 1, "failed_after_step": 5,
                   "detection_seconds": 0.5, "recovery_seconds": 12.25,
                   "resumed_from_step": 3, "steps_lost": 2, "samples_lost": 128}]}
    written = write_run(tmp_path, path.name, doc)
    code, text, err = run_report([tmp_path])
    assert code == 0 and err == "", err
    lines = [li for li in text.splitlines() if "--recovery restart" in li]
    assert len(lines) == 1 and lines[0].endswith(
        ", N=2, seed 42: --recovery restart, 1 restart; goodput 12.8 img/sec over 50.0 s of "
        "wall time from the first start; 1@step6:kill: 12.2 s to the first step after it, 2 "
        f"steps redone; {written}"), lines
    _, out, _ = run_report([tmp_path], "json")
    detail = json.loads(out)["accuracy_groups"][0]["rows"][0]["runs_detail"][0]
    assert detail["recovery"] == doc["recovery"]
    # without one, nothing is said and the run's detail has no such field
    _, plain, _ = run_report([TARGET], "json")
    assert "recovery" not in plain


def test_supervise_needs_a_command():
    assert refused("supervise", "--restarts", "1").startswith(
        "commbench: error: supervise: no command to run; give it after --")


@pytest.mark.job
@pytest.mark.timeout(120)
def test_supervise_runs_a_failed_command_again_and_a_refused_one_not(tmp_path):
    script = ("import os, pathlib, sys; p = pathlib.Path(sys.argv[1]); n = len(p.read_text()) "
              "if p.exists() else 0; p.write_text('x' * (n + 1)); "
              "print('detected', os.environ.get('COMMBENCH_FAILURE_DETECTED_AT'), "
              "os.environ['COMMBENCH_SUPERVISE_RESTARTS']); sys.exit(int(sys.argv[2 + n]))")
    count = tmp_path / "count"
    done = run([PYTHON, "-m", "commbench", "supervise", "--restarts", "2", "--", PYTHON, "-c",
                script, str(count), "3", "0"], timeout=60)
    assert done.returncode == 0 and count.read_text() == "xx", done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(
        "commbench supervise: the job ended with exit status 3; starting it again (1 of 2 "
        "restarts)"), done.stderr
    first, second = done.stdout.splitlines()
    assert first == "detected None 2" and float(second.split()[1]) <= time.time()
    count.unlink()
    done = run([PYTHON, "-m", "commbench", "supervise", "--restarts", "2", "--", PYTHON, "-c",
                script, str(count), "2", "0"], timeout=60)
    assert done.returncode == 2 and count.read_text() == "x", done.stderr


def finished(results: Path) -> Path:
    """The job's retired checkpoint directory."""
    found = list((results / "checkpoints").glob("job-*.finished-*"))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def without_failure(tmp_path_factory):
    """A run that restarts but never fails: its result, output and command."""
    results = tmp_path_factory.mktemp("reference")
    args = ["-m", "commbench", *TINY, *RESTART, "--results-dir", str(results)]
    done = torchrun(2, ["--max-restarts", "1", *args], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return only_result(results), done.stdout, args, results


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_a_run_without_a_checkpoint_starts_from_scratch_and_records_no_failure(
        without_failure):
    doc, out, _, results = without_failure
    assert f"No checkpoint of this job in {results}/checkpoints/job-" in out
    assert ": training starts from step 0" in out and "Resumed" not in out
    recovery = doc["recovery"]
    assert recovery["costs"] == [] and recovery["restarts"] == 0
    assert "failures" not in doc
    assert recovery["goodput"] == pytest.approx(10 * 64 / recovery["wall_seconds"])
    assert "Goodput: " in out and "0 restarts included" in out
    assert [p.name for p in sorted(finished(results).glob("step-*"))] == [
        "step-00000006", "step-00000009"]


def check_recovered(done, results, reference, launcher, event="1@step6:kill",
                    detected=(0, 30)):
    """The job whose rank 1 failed at step 6 resumed from step 3 and ended as the run
    without a failure did; its result says what the failure cost."""
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"failure injected by --fail ({event})" in done.stderr
    assert "the launcher starts the job again now" in done.stderr or "stop" in event
    assert "Resumed from checkpoint " in done.stdout and "(step 3)" in done.stdout
    doc = only_result(results)
    assert doc["environment"]["launcher"] == launcher
    recovery = doc["recovery"]
    assert recovery["restarts"] == 1 and len(recovery["costs"]) == 1
    cost = recovery["costs"][0]
    assert cost["event"] == event and cost["rank"] == 1
    assert cost["failed_after_step"] == 5 and cost["resumed_from_step"] == 3
    assert cost["steps_lost"] == 2 and cost["samples_lost"] == 2 * 64
    assert detected[0] <= cost["detection_seconds"] < detected[1], cost
    assert cost["detection_seconds"] <= cost["restart_seconds"], cost
    assert cost["detection_seconds"] < cost["recovery_seconds"] < 180, cost
    assert recovery["goodput"] < reference["summary"]["img_sec"]
    assert doc["summary"]["steps"] == 10 and len(doc["curve"]) == 2
    # on the wire: both attempts', 5 steps then 7 (from step 3), against 10 steps
    sent = doc["summary"]["bytes_sent"] / reference["summary"]["bytes_sent"]
    assert sent == pytest.approx(12 / 10, rel=0.05)
    assert doc["failures"]["spec"] == event
    line = next(li for li in done.stdout.splitlines() if li.startswith("Failure "))
    assert line.startswith(f"Failure {event}: detected after ") and \
        "resumed from step 3, 2 steps (128 images) redone" in line
    # dense: resuming from the checkpoint is exact
    assert recovery["final_model_sha256"] == reference["recovery"]["final_model_sha256"]


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_torchrun_restarts_a_killed_job_which_resumes_from_its_checkpoint(tmp_path,
                                                                        without_failure):
    results, trace = tmp_path / "results", tmp_path / "trace.json"
    results.mkdir()
    done = torchrun(2, ["--max-restarts", "1", "-m", "commbench", *TINY, *RESTART,
                        "--fail", "1@step6", "--results-dir", str(results), "--timeline",
                        str(trace)], timeout=300)
    check_recovered(done, results, without_failure[0], "torchrun")
    # the timeline of the last start: the failure on rank 1's track before its first
    # step, its recovery ending in that step (commbench.timing.failure_track)
    events = json.loads(trace.read_text())["traceEvents"]
    [cost] = only_result(results)["recovery"]["costs"]
    fired = [e for e in events if e.get("cat") == "failure"]
    assert [(e["ph"], e["name"], e["pid"]) for e in fired[:2]] == [
        ("i", "failure 1@step6:kill", 1),
        ("X", "recovery: to the first complete step after it", 1)]
    assert fired[1]["dur"] == pytest.approx(cost["recovery_seconds"] * 1e6)
    # nested in it, longest first: the restart, and the detection within it (or as long)
    nested = {e["name"]: e["dur"] for e in fired[2:] if e["ph"] == "X" and e["pid"] == 1}
    assert nested == pytest.approx({
        "restart: the launcher started the job again": cost["restart_seconds"] * 1e6,
        "detection": cost["detection_seconds"] * 1e6}) and len(fired) == 4
    steps = [e for e in events if e.get("cat") == "step"]
    first, end = min(e["ts"] for e in steps), fired[1]["ts"] + fired[1]["dur"]
    assert fired[0]["ts"] == 0 < first
    # rank 0's first step after the restart ends with the recovery (wall clock and span
    # clock put together: within half a second)
    ends = sorted(e["ts"] + e["dur"] for e in steps if e["pid"] == 0)
    assert abs(ends[0] - end) < 0.5e6, (end, ends[:3])


def supervised(tmp_path, *args):
    """commbench supervise --restarts 1 around mpiexec -n 2 of the tiny restarting run."""
    return run([PYTHON, "-m", "commbench", "supervise", "--restarts", "1", "--",
                mpiexec_path(), "-n", "2", "--oversubscribe", "--bind-to", "none", PYTHON,
                "-m", "commbench", *TINY, *RESTART, *args, "--results-dir", str(tmp_path)],
               timeout=300)


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_supervise_restarts_a_killed_mpiexec_job_which_resumes_from_its_checkpoint(
        tmp_path, without_failure):
    done = supervised(tmp_path, "--fail", "1@step6")
    # 137 where mpiexec reports the killed rank first, 1 where a peer's lost connection
    # ends its own process first: which comes first depends on the load.
    assert re.search(r"commbench supervise: the job ended with exit status (137|1); starting "
                     r"it again \(1 of 1 restarts\)", done.stderr), done.stderr[-3000:]
    check_recovered(done, tmp_path, without_failure[0], "openmpi")


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_a_stopped_rank_is_detected_at_the_timeout_and_the_job_restarted(tmp_path,
                                                                        without_failure):
    done = supervised(tmp_path, "--fail", "1@step6:stop", "--timeout", "10")
    assert "commbench supervise: the job ended with exit status 1; starting it again " \
        "(1 of 1 restarts)" in done.stderr, done.stderr[-3000:]
    check_recovered(done, tmp_path, without_failure[0], "openmpi", "1@step6:stop", (10, 40))


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_a_damaged_checkpoint_is_ignored_and_the_one_before_it_resumed(without_failure):
    doc, _, args, results = without_failure
    kept = finished(results)
    job = kept.with_name(kept.name.split(".")[0])
    job.mkdir()
    shutil.copytree(kept / "step-00000006", job / "step-00000006")
    (job / "step-00000009").mkdir()
    (job / "step-00000009" / ".metadata").write_bytes(b"\0garbage")
    shutil.copytree(kept / "step-00000009", job / "step-00000012.partial")
    (results / doc_path(results)).unlink()
    done = torchrun(2, ["--max-restarts", "1", *args], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [li for li in done.stdout.splitlines() if li.startswith("Warning: checkpoint")]
    assert len(warnings) == 2, done.stdout
    assert warnings[0] == (f"Warning: checkpoint {job}/step-00000012.partial was cut short "
                           "before it was complete; ignored")
    assert warnings[1].startswith(f"Warning: checkpoint {job}/step-00000009 cannot be read")
    assert f"Resumed from checkpoint {job}/step-00000006 (step 6)" in done.stdout
    again = only_result(results)
    assert again["recovery"]["final_model_sha256"] == doc["recovery"]["final_model_sha256"]
    assert json.dumps(again["curve"][1]["accuracy"]) == \
        json.dumps(doc["curve"][1]["accuracy"])


def doc_path(results: Path) -> str:
    found = list(results.glob("*.json"))
    assert len(found) == 1, found
    return found[0].name

