"""local_sgd: local steps and the models averaged every H-th step, after a warm-up of
averaging every step, against the dense reference through mpiexec (with the consensus
distance zero right after each averaging and not between:
tests/programs/check_strategies.py); a whole run of `python -m commbench`; the flags
it refuses."""

import json

import pytest

from cli_helpers import commbench, refused
from commbench.timing import wire
from programs.check_strategies import CHECKS_TIMEOUT, assert_strategy_clean
from launchers import mpiexec
from programs.commbench_runs import assert_usage_error, consensus_of, run_commbench

STRATEGY = "local_sgd"
# Training to accuracy in seconds: 64 samples, 4 steps per epoch on 2 ranks of 8.
TINY_TASK = ["--model", "resnet18", "--image-size", "32", "--batch-size", "8", "--data",
             "learnable:samples=64"]


@pytest.mark.timeout(CHECKS_TIMEOUT)
@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_local_steps_and_averages_match_the_dense_reference(n):
    assert_strategy_clean(n, STRATEGY)


@pytest.mark.mpi
def test_a_run_averages_every_h_steps_and_records_the_drift_between(tmp_path):
    # TINY_RUN: one warm-up step, then 3 iterations of 2 steps; H=2 averages after the
    # first step of each iteration, so each ends one local step away from the average.
    doc = run_commbench(2, STRATEGY, ["--average-every", "2"], tmp_path)
    assert doc["strategy"] == {"name": STRATEGY, "decentralized": True, "average_every": 2,
                               "local_warmup_steps": 0, "meetings": 3}  # steps 2, 4, 6 of 7
    assert doc["config"]["average_every"] == 2
    assert all(distance > 0 for distance in consensus_of(doc))
    # On the wire: the model's parameters and floating buffers in a ring of 2 (each rank
    # sends it all once), in the steps that average only; their split apart.
    model = sum(t.numel() * t.element_size() for t in resnet18_tensors())
    assert doc["samples"]["sent_bytes"] == [[model, 0] * 3] * 2
    wire = doc["summary"]["wire"]
    assert wire["communicating_steps"] == 0.5 and wire["bytes_per_step"] == model / 2
    by_steps = doc["summary"]["step_split_by_steps"]
    assert by_steps["communicating"]["exposed"]["mean"] > by_steps["local"]["exposed"]["mean"]
    split = doc["summary"]["step_split"]
    assert split["exposed"]["mean"] > 0, split


@pytest.mark.mpi
def test_on_two_machines_it_averages_inside_each_every_h1_and_over_all_every_h2(tmp_path):
    # --average-every 1,2 on 2 simulated machines of 2: after the warm-up step (inside
    # the machines), the measured steps average over all, then inside, in turn.
    doc = run_commbench(4, STRATEGY, ["--average-every", "1,2", "--machine-size", "2"],
                        tmp_path)
    assert doc["strategy"]["average_every"] == [1, 2]
    model = sum(t.numel() * t.element_size() for t in resnet18_tensors())
    everyone, machine = wire.ring_allreduce(model, 4), wire.ring_allreduce(model, 2)
    assert doc["samples"]["sent_bytes"] == [[everyone.nbytes, machine.nbytes] * 3] * 4
    assert all(distance > 0 for distance in consensus_of(doc))  # machines differ


def resnet18_tensors():
    import torch
    import torchvision

    model = torchvision.models.resnet18()
    return [*model.parameters(), *(b for b in model.buffers() if torch.is_floating_point(b))]


@pytest.mark.parametrize("flags, message", [
    (["--average-every", "0"], "argument --average-every: must be a positive integer"),
    (["--local-warmup-steps", "-1"], "argument --local-warmup-steps: must be an integer >= 0"),
    (["--average-every", "64", "--num-iters", "2"],
     "argument --average-every: 64 steps is more than the 20 steps this run measures"),
    (["--average-every", "4,2"], "argument --average-every: must be a positive integer H, or "
     "two, h1,h2, with h1 < h2, got '4,2'"),
    (["--average-every", "2,4,8"], "argument --average-every: must be a positive integer H"),
])
def test_bad_settings_are_one_line(flags, message):
    assert message in refused("--dist-optimizer", STRATEGY, *flags)


def test_its_flags_mean_nothing_to_another_strategy():
    assert refused("--dist-optimizer", "allreduce", "--average-every", "4") == (
        "commbench: error: argument --average-every: means nothing to allreduce; only "
        "diloco and local_sgd read it")


def test_a_sweep_hands_its_flags_to_its_jobs_only():
    done = commbench("sweep", "--dry-run", "--np", "2", "--dist-optimizer",
                     "allreduce,local_sgd", "--average-every", "4")
    assert done.returncode == 0, done.stderr
    jobs = [line for line in done.stdout.splitlines() if "--dist-optimizer=" in line]
    assert len(jobs) == 2 and "--average-every" not in jobs[0], jobs
    assert "--dist-optimizer=local_sgd --average-every 4" in jobs[1], jobs


def test_a_run_to_accuracy_that_would_never_meet_is_refused():
    """--average-every beyond every step the run may take: local SGD in name only."""
    from dataclasses import replace

    from commbench import registry
    from commbench.config.run_config import RunConfig
    from commbench.errors import UsageError
    from commbench.job.accuracy_loop import check_length
    from commbench.job.stop_rule import StopRule

    cls = registry.resolve(STRATEGY)
    config = RunConfig(dist_optimizer=STRATEGY, data="learnable", max_epochs=1.0,
                       options={"average_every": 16})
    rule = StopRule.of(config, steps_per_epoch=10)
    with pytest.raises(UsageError, match=r"^argument --average-every: 16 ends no period "
                       r"within the 10 steps this run trains at most \(--max-epochs 1 x 10 "
                       r"steps per epoch\)"):
        check_length(cls, config, rule, 10)
    met_once = replace(config, options={"average_every": 10})
    check_length(cls, met_once, StopRule.of(met_once, 10), 10)
    warm = replace(config, options={"average_every": 16, "local_warmup_steps": 1})
    check_length(cls, warm, StopRule.of(warm, 10), 10)  # the warm-up averages
    inside = replace(config, options={"average_every": [4, 16]})
    check_length(cls, inside, StopRule.of(inside, 10), 10)  # meets inside machines
    budget = replace(config, max_epochs=None, time_budget=60.0)
    check_length(cls, budget, StopRule.of(budget, 10), 10)  # not bounded in steps
    check_length(registry.resolve("allreduce"), config, rule, 10)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_run_to_accuracy_that_would_never_meet_ends_every_rank_in_one_line(tmp_path):
    # 64 samples over 2 ranks of 8: 4 steps per epoch, so 4 steps in all
    assert_usage_error(2, ["--dist-optimizer", STRATEGY, "--max-epochs", "1",
                           "--average-every", "8", "--timeout", "60"],
                       "commbench: error: argument --average-every: 8 ends no period within "
                       "the 4 steps this run trains at most (--max-epochs 1 x 4 steps per "
                       "epoch): the models would never meet, and the run would be local_sgd "
                       "in name only; average more often or train longer", tmp_path, TINY_TASK)
    assert not list(tmp_path.iterdir())


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_a_run_to_accuracy_ended_by_its_budget_before_a_meeting_records_and_says_so(tmp_path):
    """Bounded by time alone, its steps cannot be known before: the result records that
    the models never met, and the console says the workers trained alone."""
    done = mpiexec(2, ["-m", "commbench", *TINY_TASK, "--dist-optimizer", STRATEGY,
                       "--time-budget", "0.001", "--eval-every", "2", "--average-every", "8",
                       "--timeout", "60", "--results-dir", str(tmp_path)], timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["summary"]["steps"] == 2 and doc["strategy"]["meetings"] == 0
    assert "Warning: the models never met in 2 steps; the workers trained alone" in done.stdout
