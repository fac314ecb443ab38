"""The language models' recipe (commbench.job.language_recipe): AdamW with nanoGPT's and
torchtitan's defaults, clipping in the optimizer's step after a strategy's exchange, a
warm-up and a cosine from torch's schedulers, flags that act on it or are refused,
and --amp's default for language models."""

import json
import types
from pathlib import Path

import pytest
import torch

from cli_helpers import commbench
from launchers import mpiexec
from commbench.config.run_config import RunConfig
from commbench.job import precision, recipe
from commbench.job.language_recipe import LanguageRecipe, clipped
from commbench.job.training_step import TrainingStep

LM = dict(model="lm-tiny")
INNER_ADAMW = Path(__file__).parent / "programs" / "inner_adamw.py"


def parameters(n=1):
    return [torch.nn.Parameter(torch.zeros(3)) for _ in range(n)]


def test_a_language_model_takes_adamw_with_the_documented_defaults():
    speed = recipe.for_speed(RunConfig(**LM))
    assert isinstance(speed, LanguageRecipe) and speed.schedule == "constant"
    optimizer = speed.optimizer(parameters())
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"], group["eps"]) == (
        6e-4, (0.9, 0.95), 0.1, 1e-8)
    facts = speed.facts()
    assert (facts["optimizer_name"], facts["max_grad_norm"]) == ("AdamW", 1.0)
    # An image model keeps the SGD recipe, untouched.
    assert type(recipe.for_speed(RunConfig())) is recipe.Recipe


def test_lr_and_weight_decay_act_on_adamw():
    trained = recipe.for_accuracy(RunConfig(lr=1e-3, weight_decay=0.0, **LM), 512, 10, 100)
    assert (trained.peak_lr, trained.lr_rule, trained.weight_decay) == (1e-3, "--lr", 0.0)
    assert trained.optimizer(parameters()).param_groups[0]["weight_decay"] == 0.0


def rates(trained, steps):
    optimizer = trained.optimizer(parameters())
    schedule = trained.scheduler(optimizer)
    found = []
    for step in range(steps):
        schedule(step, 0.0)
        found.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
    return found


def test_training_warms_up_then_decays_by_a_cosine_to_a_tenth_of_the_peak():
    trained = recipe.for_accuracy(RunConfig(warmup_epochs=2, **LM), 8, 10, max_steps=120)
    assert (trained.warmup_steps, trained.total_steps, trained.min_lr) == (
        20, 120, pytest.approx(6e-5))
    lr = rates(trained, 121)
    assert lr[0] == pytest.approx(6e-4 / 20) and lr[19] == pytest.approx(6e-4)
    assert lr[20] == pytest.approx(6e-4)  # the cosine starts at the peak
    assert lr[70] == pytest.approx(6e-5 + (6e-4 - 6e-5) / 2)  # halfway
    assert lr[120] == pytest.approx(6e-5)
    assert all(a <= b for a, b in zip(lr[:20], lr[1:21]))
    assert all(a >= b for a, b in zip(lr[20:], lr[21:]))


def test_a_run_resumed_at_a_later_step_takes_that_steps_rate_whatever_was_loaded():
    """A restart, a heal or a rejoin loads the optimizer's state, its rate with it, then
    asks for the step it resumes at: the rate is that step's, as in a run never stopped
    (and again for an earlier step, as an undone sync asks)."""
    trained = recipe.for_accuracy(RunConfig(warmup_epochs=2, **LM), 8, 10, max_steps=120)
    lr = rates(trained, 121)
    optimizer = trained.optimizer(parameters())
    schedule = trained.scheduler(optimizer)
    for step, loaded in ((40, lr[39]), (75, 1.0), (30, lr[75]), (120, lr[30])):
        for group in optimizer.param_groups:
            group["lr"] = loaded
        schedule(step, 0.0)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr[step], rel=1e-12)


def test_a_time_budget_alone_keeps_the_peak_after_the_warm_up():
    trained = recipe.for_accuracy(RunConfig(time_budget=60, warmup_epochs=1, **LM), 8, 4,
                                  max_steps=None)
    assert "no step bound" in trained.schedule
    assert rates(trained, 10) == pytest.approx([1.5e-4, 3e-4, 4.5e-4] + [6e-4] * 7)


def test_a_speed_run_keeps_the_peak():
    assert rates(recipe.for_speed(RunConfig(**LM)), 5) == [6e-4] * 5


def test_clipping_acts_on_the_gradient_the_exchange_left_at_the_update():
    """The gradient a strategy's exchange writes before the update (as gradient_allreduce
    and Horovod's synchronize do) is the one clipped: here an "exchange" multiplies
    it by 100, and plain SGD at lr 1 then moves the parameters by exactly the norm 1."""
    model = torch.nn.Linear(4, 2)
    optimizer = clipped(torch.optim.SGD, 1.0)(model.parameters(), lr=1.0)
    before = torch.cat([p.detach().clone().flatten() for p in model.parameters()])

    def exchange(started):
        for p in model.parameters():
            p.grad.mul_(100)

    step = TrainingStep(model, optimizer, before_update=exchange)
    step(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (after - before).norm().item() == pytest.approx(1.0, rel=1e-5)


def test_a_derived_optimizer_steps_through_the_clipping():
    """Horovod and Bluefog derive a class from the optimizer's and call its step through
    super() after their exchange: that step still clips."""
    base = type(LanguageRecipe.for_speed(RunConfig(**LM)).optimizer(parameters()))
    derived = type("Distributed", (base,), {"step": lambda self: super(
        derived, self).step()})
    params = parameters(2)
    optimizer = derived(params, lr=0.0)
    for p in params:
        p.grad = torch.full((3,), 10.0)
    optimizer.step()
    assert torch.cat([p.grad for p in params]).norm().item() == pytest.approx(1.0)


def test_amp_auto_is_bf16_for_a_language_model_on_a_gpu_that_has_it(monkeypatch):
    cpu, gpu = types.SimpleNamespace(type="cpu"), types.SimpleNamespace(type="cuda")
    assert precision.resolve("auto", True, cpu) == "off"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.resolve("auto", True, gpu) == "bf16"
    assert precision.resolve("auto", False, gpu) == "off"  # image runs as before
    assert precision.resolve("off", True, gpu) == "off"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert precision.resolve("auto", True, gpu) == "off"


def test_momentum_is_refused_for_a_language_model_in_one_line():
    done = commbench("--model", "lm-tiny", "--momentum", "0.5", "--no-cuda")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert ("argument --momentum: lm-tiny trains with AdamW (commbench.job.language_recipe), "
            "whose betas (0.9, 0.95) take SGD's momentum's place") in lines[0]


def test_the_described_recipe_says_adamw_and_its_schedule():
    line = recipe.for_accuracy(RunConfig(warmup_epochs=1, **LM), 8, 10, 50).describe()
    assert line == ("Recipe: AdamW, betas (0.9, 0.95), eps 1e-08, weight decay 0.1, "
                    "gradients clipped to norm 1; learning rate 0.0006 (nanoGPT's 0.0006 "
                    "for GPT-2), 10 warm-up steps, then cosine to a tenth of the peak")


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["local_sgd", "diloco"])
def test_periodic_strategies_step_with_adamw_and_each_worker_keeps_its_state(strategy):
    """Each worker's AdamW moments after a meeting are those it would have alone; the
    parameters are shared; diloco's outer step stays the paper's Nesterov SGD."""
    pytest.importorskip("transformers")
    done = mpiexec(2, [str(INNER_ADAMW), strategy], timeout=200, env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = json.loads(next(line for line in done.stdout.splitlines()
                            if line.startswith("INNER "))[len("INNER "):])
    for rank in ranks:
        assert rank["adamw"] and rank["meetings"] == 1 and rank["steps"] == [2.0]
        assert rank["state_is_the_twins"]  # the meeting left the moments alone
        assert rank["parameter_sum"] != rank["twin_parameter_sum"]  # it moved the weights
    assert ranks[0]["parameter_sum"] == ranks[1]["parameter_sum"]
    assert ranks[0]["moment_sum"] != ranks[1]["moment_sum"]  # each worker's own
    outer = [rank["outer"] for rank in ranks]
    assert outer == [None, None] if strategy == "local_sgd" else outer == [
        {"name": "SGD", "lr": 0.7, "momentum": 0.9, "nesterov": True}] * 2
