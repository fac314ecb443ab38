"""The training recipe (commbench.job.recipe): a speed run keeps the benchmarks' constant
learning rate; a run trained to accuracy scales its peak with the total batch, warms
up linearly and decays by a cosine to zero over its budget; flags override both."""

import math

import pytest
import torch

from commbench.config.run_config import RunConfig
from commbench.job.recipe import Recipe


def test_a_speed_run_keeps_the_benchmarks_recipe():
    recipe = Recipe.for_speed(RunConfig())
    assert (recipe.peak_lr, recipe.momentum, recipe.weight_decay) == (0.01, 0.9, 0.0)
    assert recipe.lr_at(0) == recipe.lr_at(10_000) == 0.01
    assert Recipe.for_speed(RunConfig(lr=0.2, weight_decay=1e-4)).optimizer(
        [torch.nn.Parameter(torch.zeros(1))]).param_groups[0]["weight_decay"] == 1e-4


def test_training_to_accuracy_scales_warms_up_and_decays_to_zero():
    config = RunConfig(data="learnable", target_accuracy=0.8, warmup_epochs=2)
    recipe = Recipe.for_accuracy(config, total_batch=128, steps_per_epoch=10, max_steps=110)
    assert recipe.peak_lr == pytest.approx(0.05)  # 0.1 x 128 / 256
    assert recipe.weight_decay == 5e-4 and recipe.warmup_steps == 20
    assert recipe.lr_at(0) == pytest.approx(0.05 / 20)
    assert recipe.lr_at(19) == pytest.approx(0.05)
    assert recipe.lr_at(20) == pytest.approx(0.05)  # the cosine starts at the peak
    assert recipe.lr_at(65) == pytest.approx(0.025)  # halfway through the decay
    assert recipe.lr_at(110) == pytest.approx(0.0, abs=1e-12)
    rates = [recipe.lr_at(s) for s in range(111)]
    assert all(a <= b for a, b in zip(rates[:20], rates[1:21]))  # warm-up rises
    assert all(a >= b for a, b in zip(rates[20:], rates[21:]))  # decay falls


def test_a_time_budget_alone_decays_over_the_training_time():
    config = RunConfig(data="learnable", time_budget=100, warmup_epochs=0)
    recipe = Recipe.for_accuracy(config, 32, 10, max_steps=None)
    assert recipe.lr_at(0, 0.0) == pytest.approx(recipe.peak_lr)
    assert recipe.lr_at(500, 50.0) == pytest.approx(recipe.peak_lr / 2)
    assert recipe.lr_at(900, 150.0) == pytest.approx(0.0, abs=1e-12)


def test_flags_override_the_peak_and_the_decay_and_apply_sets_every_group():
    config = RunConfig(data="learnable", lr=0.3, weight_decay=0.0, warmup_epochs=0)
    recipe = Recipe.for_accuracy(config, 512, 10, max_steps=100)
    assert (recipe.peak_lr, recipe.lr_rule, recipe.weight_decay) == (0.3, "--lr", 0.0)
    optimizer = recipe.optimizer([torch.nn.Parameter(torch.zeros(1))])
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    recipe.apply(optimizer, 50, 0.0)
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(
        0.3 * 0.5 * (1 + math.cos(math.pi * 0.5)))] * 2
