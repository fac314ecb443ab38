"""The loop of the contenders whose arms run in one job: every rank runs every arm in
every round (a quiet in-process `commbench run`, or a plain hand-written loop to hold
commbench against), so that the machine's drift hits the arms alike; then rank 0
prints the ratios. What each contender's arms are: arms.py; the table: contenders.py."""

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
import torchvision

from commbench.config.run_config import RunConfig, add_run_arguments
from commbench.job.language_recipe import MAX_GRAD_NORM, LanguageRecipe
from commbench.job.recipe import Recipe
from commbench.job.run import run


@dataclass
class Job:
    """What a contender's setup hands the loop: its ranks' context and its arms, each
    a function of the round giving total img/sec (on rank 0; None elsewhere)."""
    ctx: object
    arms: Dict[str, Callable[[int], Optional[float]]]
    report: Callable[[Dict[str, List[float]]], List[str]]  # rank 0's closing lines
    rotate: bool = False  # each arm first, second, ... equally often (else fixed order)
    after: List[Callable[[], None]] = field(default_factory=list)  # before the scratch goes


def parser(name: str, question: str, **defaults) -> argparse.ArgumentParser:
    """`--rounds` plus every `commbench run` flag, with the contender's defaults."""
    p = argparse.ArgumentParser(prog=f"ab.py {name}", description=question)
    p.add_argument("--rounds", type=int, default=3)
    add_run_arguments(p)
    p.set_defaults(**defaults)
    return p


def compare(contender, setup: Callable[[argparse.Namespace], "Job"], argv: List[str]) -> None:
    """Run `contender`'s arms, made by `setup` (arms.py), in alternating rounds of this
    job and print the ratios."""
    args = parser(contender.name, contender.question, **contender.defaults).parse_args(argv)
    with tempfile.TemporaryDirectory() as results_dir:
        args.results_dir = results_dir
        job = setup(args)
        rates = {arm: [] for arm in job.arms}
        for round_ in range(args.rounds):
            names = list(job.arms)
            if job.rotate:
                names = names[round_ % len(names):] + names[:round_ % len(names)]
            for arm in names:
                rates[arm].append(job.arms[arm](round_))
            report_rounds(rates, job.ctx.rank)
        for step in job.after:
            step()
    if job.ctx.rank == 0:
        for line in job.report(rates):
            print(line)


def hand_written(config: RunConfig, rank: int, wrap: Callable, total: Callable) -> float:
    """Mean total img/sec (a language model's tokens/sec) of the plainest correct loop
    (the shape of Horovod's pytorch_synthetic_benchmark.py). wrap(model, optimizer) ->
    (model, optimizer) adds the communication; total(rate) sums a rank's rate over all
    ranks."""
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed + rank)
    if config.language_model:
        model, optimizer, loss = language_model_loop(config, generator, wrap)
    else:
        model = getattr(torchvision.models, config.model)(num_classes=config.num_classes)
        optimizer = Recipe.for_speed(config).optimizer(model.parameters())
        model, optimizer = wrap(model, optimizer)
        data = torch.randn(config.batch_size, 3, config.image_size, config.image_size,
                           generator=generator)
        target = torch.randint(config.num_classes, (config.batch_size,), generator=generator)

        def loss():
            return F.cross_entropy(model(data), target)

    def step():
        optimizer.zero_grad()
        loss().backward()
        if config.language_model:  # the language models' recipe clips, as nanoGPT does
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()

    for _ in range(config.num_warmup_batches):
        step()
    rates = []
    for _ in range(config.num_iters):
        start = time.perf_counter()
        for _ in range(config.num_batches_per_iter):
            step()
        rates.append(total(config.batch_size * config.per_sample * config.num_batches_per_iter
                           / (time.perf_counter() - start)))
    return statistics.mean(rates)


def language_model_loop(config: RunConfig, generator: torch.Generator, wrap: Callable):
    """A bare language-model loop: the named size built from transformers' configuration,
    torch's AdamW with the recipe's figures, random token ids generated once and each
    position's next token as its label; the loss from the model's own output."""
    from commbench.job import language_models

    model = language_models.build(config.model)
    recipe = LanguageRecipe.for_speed(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.peak_lr, betas=recipe.betas,
                                  eps=recipe.eps, weight_decay=recipe.weight_decay)
    model, optimizer = wrap(model, optimizer)
    ids = torch.randint(config.language_model.vocab, (config.batch_size, config.per_sample + 1),
                        generator=generator)
    data, target = ids[:, :-1].contiguous(), ids[:, 1:].reshape(-1)

    def loss():
        return F.cross_entropy(model(data).logits.flatten(0, 1), target)

    return model, optimizer, loss


def workload(config: RunConfig) -> str:
    """The contender's workload as its closing line names it."""
    shape = (f"{config.per_sample} tokens" if config.language_model
             else f"{config.image_size}px")
    return f"{config.model} {shape} batch {config.batch_size}"


def commbench_rate(config: RunConfig) -> Optional[float]:
    """Total img/sec of `commbench run` (rank 0; None elsewhere), its report silenced."""
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        doc = run(config)
    return doc["summary"]["total_img_sec"]["mean"] if doc else None


def report_rounds(rates: Dict[str, List[float]], rank: int) -> None:
    if rank == 0:
        print(f"round {len(next(iter(rates.values()))) - 1}: " + ", ".join(
            f"{name} {values[-1]:.1f}" for name, values in rates.items())
            + " (total img/sec, a language model's tokens/sec)", flush=True)
