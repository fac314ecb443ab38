"""Training to accuracy (commbench.job.accuracy_loop): the stop rule, the averaged model, a
curve that a seed makes reproducible, "not reached" never given a time, and requests
that cannot be trained refused in one line."""

import json
import re
from pathlib import Path

import pytest

from cli_helpers import commbench, refused
from commbench.config.run_config import RunConfig
from commbench.job.accuracy_loop import Point, outcome
from commbench.job.stop_rule import MAX_EPOCHS, StopRule
from launchers import PYTHON, mpiexec, only_result, run
from test_spans import check_trace

PROGRAMS = Path(__file__).resolve().parent / "programs"
# A task small enough for seconds: 320 training samples (32 validation), 10 steps per epoch.
TINY_TASK = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32", "--data",
             "learnable:samples=320,noise=2", "--reference-iters", "0"]


def point(step, accuracy, training=1.0):
    return Point(step, step / 10, step * 32, training, training + 0.5, accuracy, accuracy,
                 accuracy, 1.0, 0.0)


def test_the_rule_stops_at_the_target_the_epochs_or_the_budget():
    rule = StopRule.of(RunConfig(target_accuracy=0.8, eval_every=5), steps_per_epoch=10)
    assert (rule.eval_every, rule.max_steps, rule.time_budget) == (5, MAX_EPOCHS * 10, None)
    assert rule.why_stop(point(5, 0.79)) is None
    assert rule.why_stop(point(10, 0.8)) == "target"
    assert rule.why_stop(point(MAX_EPOCHS * 10, 0.5)) == "max epochs"
    budget = StopRule.of(RunConfig(target_accuracy=0.8, time_budget=60), steps_per_epoch=10)
    assert budget.max_steps is None  # a budget alone bounds the run
    assert budget.why_stop(point(10_000, 0.5, training=59)) is None
    assert budget.why_stop(point(10_000, 0.5, training=60)) == "time budget"
    both = StopRule.of(RunConfig(max_epochs=0.5, time_budget=60), steps_per_epoch=10)
    assert both.max_steps == 5 and both.target is None


def test_not_reached_records_the_best_accuracy_and_no_time():
    rule = StopRule(0.9, 5, 10, None)
    found = outcome([point(5, 0.7), point(10, 0.6)], rule, "max epochs", 32)
    assert found["reached"] is False and found["best_accuracy"] == 0.7
    assert found["best_at_step"] == 5
    assert all(found[k] is None for k in ("time_to_target", "wall_time_to_target",
                                          "steps_to_target", "epochs_to_target",
                                          "samples_to_target"))
    reached = outcome([point(5, 0.7), point(10, 0.95, training=3.0)], rule, "target", 32)
    assert reached["reached"] and reached["time_to_target"] == 3.0
    assert (reached["steps_to_target"], reached["samples_to_target"]) == (10, 320)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_the_averaged_model_is_the_mean_of_the_workers_parameters_and_statistics():
    done = mpiexec(3, [str(PROGRAMS / "check_averaged_model.py")], timeout=100)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert all(f"OK {r}" in done.stdout for r in range(3)), done.stdout


def train(tmp_path, name, *flags, n=None):
    out = tmp_path / name
    command = ["-m", "commbench", *TINY_TASK, "--results-dir", str(out), *flags]
    done = mpiexec(n, command, timeout=240) if n else \
        run([PYTHON, *command], timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done, only_result(out)


@pytest.mark.job
@pytest.mark.timeout(600)
def test_one_worker_curve_is_the_same_from_the_same_seed_and_not_reached_has_no_time(tmp_path):
    runs = [train(tmp_path, f"r{i}", "--target-accuracy", "1", "--eval-every", "3",
                  "--max-epochs", "0.6") for i in range(2)]
    (done, doc), (_, again) = runs
    assert doc["kind"] == "accuracy"
    assert doc["config"]["num_classes"] == 10  # what was used: the task's, not 1000
    # one recipe: the peak scaled with the total batch, warm-up over the first epoch
    assert doc["recipe"]["peak_lr"] == pytest.approx(0.1 * 32 / 256)
    assert (doc["recipe"]["warmup_steps"], doc["recipe"]["total_steps"]) == (6, 6)
    assert "Recipe: SGD, momentum 0.9, weight decay 0.0005; learning rate 0.0125" in done.stdout
    curve = doc["curve"]
    assert [p["step"] for p in curve] == [3, 6]  # every 3 steps, and the last (0.6 epochs)
    keys = ("accuracy", "worker_mean", "worker_worst", "loss")
    assert [[p[k] for k in keys] for p in curve] == [[p[k] for k in keys] for p in again["curve"]]
    s = doc["summary"]
    assert s["reached"] is False and s["time_to_target"] is None
    assert s["stopped_by"] == "max epochs" and s["steps"] == 6
    assert all(0 <= p["accuracy"] <= 1 for p in curve)
    assert curve[0]["training_seconds"] <= curve[0]["wall_seconds"]  # evaluation is wall only
    assert "Target 1 not reached; best accuracy" in done.stdout
    assert len(re.findall(r"^Step \d", done.stdout, re.MULTILINE)) == 2


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_two_workers_stop_together_at_the_target(tmp_path):
    trace_path = tmp_path / "trace.json"
    done, doc = train(tmp_path, "na", "--dist-optimizer", "neighbor_allreduce",
                      "--target-accuracy", "0.05", "--eval-every", "2",
                      "--timeline", str(trace_path), "--timeline-steps", "1", n=2)
    s = doc["summary"]
    assert s["reached"] is True and s["stopped_by"] == "target"
    steps = s["steps_to_target"]
    assert steps % 2 == 0 and s["samples_to_target"] == steps * 32 * 2
    assert [p["step"] for p in doc["curve"]] == list(range(2, steps + 1, 2))
    assert s["time_to_target"] == doc["curve"][-1]["training_seconds"] > 0
    assert doc["curve"][-1]["worker_worst"] <= doc["curve"][-1]["worker_mean"]
    assert doc["strategy"]["name"] == "neighbor_allreduce"
    assert done.stdout.count("Time to target 0.05: ") == 1
    # the timeline holds the last step and the evaluation and consensus measurement after
    # it, outside every step's split
    assert doc["summary"]["step_split"]["step"]["mean"] > 0
    assert "Step split (mean per step): " in done.stdout
    assert f"Timeline: {trace_path}" in done.stdout
    recorded = check_trace(json.loads(trace_path.read_text())["traceEvents"], 2)
    assert {e["args"]["step"] for e in recorded} == {steps - 1}
    for rank in (0, 1):
        mine = [e for e in recorded if e["pid"] == rank]
        (step,) = [e for e in mine if e["cat"] == "step"]
        between = [e for e in mine if e["cat"] in ("evaluate", "consensus")]
        assert sorted(e["cat"] for e in between) == ["consensus", "evaluate"]
        assert all(e["ts"] >= step["ts"] + step["dur"] for e in between)


@pytest.mark.parametrize("flags, message", [
    (["--target-accuracy", "0.8"], "argument --target-accuracy: training to accuracy needs "
                                   "--data learnable"),
    (["--eval-every", "5"], "argument --eval-every: training to accuracy needs"),
    (["--target-accuracy", "1.5", "--data", "learnable"],
     "argument --target-accuracy: must be a number greater than 0 and at most 1"),
    (["--target-accuracy", "0", "--data", "learnable"],
     "argument --target-accuracy: must be a number greater than 0 and at most 1"),
])
def test_requests_that_cannot_train_are_one_line(flags, message, tmp_path):
    done = commbench("--results-dir", str(tmp_path), *flags)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr, done.stderr
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("flag, value", [("--num-iters", "5"), ("--num-batches-per-iter", "2"),
                                         ("--num-warmup-batches", "0"),
                                         ("--reference-iters", "2"),
                                         ("--reference-seconds", "0.5")])
def test_a_speed_run_flag_is_refused_when_training_to_accuracy(flag, value):
    assert refused("--data", "learnable", "--max-epochs", "1", flag, value) == (
        f"commbench: error: argument {flag}: sets up a speed run's timed iterations; training "
        "to accuracy counts steps and epochs (--eval-every, --max-epochs, --time-budget) and "
        "measures no compute-only reference: leave it out")


def test_training_to_accuracy_records_that_it_measures_no_reference():
    from commbench.cli import build_parser
    from commbench.config.run_config import config_from_args

    def config(*argv):
        return config_from_args(build_parser().parse_args(["run", "--data", "learnable",
                                                           *argv]))

    assert config("--max-epochs", "1").reference_iters == 0  # not the speed run's 3
    assert config("--max-epochs", "1", "--reference-iters", "0").reference_iters == 0
    assert config().reference_iters == 3
