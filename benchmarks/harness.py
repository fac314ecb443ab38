"""What the benchmark scripts share: their flags, a plain synthetic training loop to
hold commbench against, and a quiet in-process `commbench run`. Each script holds
two contenders in one job and alternates rounds, so drift hits both alike."""

import argparse
import contextlib
import os
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
import torchvision

from commbench.config import RunConfig, add_run_arguments
from commbench.recipe import Recipe
from commbench.run import run


def parser(doc: str, **defaults) -> argparse.ArgumentParser:
    """`--rounds` plus every `commbench run` flag, with the script's defaults."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    add_run_arguments(p)
    p.set_defaults(**defaults)
    return p


def hand_written(config: RunConfig, rank: int, wrap: Callable, total: Callable) -> float:
    """Mean total img/sec of the plainest correct loop (the shape of Horovod's
    pytorch_synthetic_benchmark.py). wrap(model, optimizer) -> (model, optimizer)
    adds the communication; total(rate) sums a rank's rate over all ranks."""
    torch.manual_seed(config.seed)
    model = getattr(torchvision.models, config.model)(num_classes=config.num_classes)
    optimizer = Recipe.for_speed(config).optimizer(model.parameters())
    model, optimizer = wrap(model, optimizer)
    generator = torch.Generator().manual_seed(config.seed + rank)
    data = torch.randn(config.batch_size, 3, config.image_size, config.image_size,
                       generator=generator)
    target = torch.randint(config.num_classes, (config.batch_size,), generator=generator)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    for _ in range(config.num_warmup_batches):
        step()
    rates = []
    for _ in range(config.num_iters):
        start = time.perf_counter()
        for _ in range(config.num_batches_per_iter):
            step()
        rates.append(total(config.batch_size * config.num_batches_per_iter
                           / (time.perf_counter() - start)))
    return statistics.mean(rates)


def commbench_rate(config: RunConfig) -> Optional[float]:
    """Total img/sec of `commbench run` (rank 0; None elsewhere), its report silenced."""
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        doc = run(config)
    return doc["summary"]["total_img_sec"]["mean"] if doc else None


def report_rounds(rates: Dict[str, List[float]], rank: int) -> None:
    if rank == 0:
        print(f"round {len(next(iter(rates.values()))) - 1}: " + ", ".join(
            f"{name} {values[-1]:.1f} img/sec" for name, values in rates.items()), flush=True)


def ratio(rates: Dict[str, List[float]], ours: str, theirs: str) -> str:
    """ours/theirs two ways: the ratio of the two medians, and the median of the
    per-round ratios (the rounds alternate, so each round pairs the contenders under
    the same load; with drift between rounds the paired figure is the steadier)."""
    medians = statistics.median(rates[ours]) / statistics.median(rates[theirs])
    pairs = [a / b for a, b in zip(rates[ours], rates[theirs])]
    low, high = interval(pairs)
    return (f"{medians:.3f} (ratio of medians), {statistics.median(pairs):.3f} (median of "
            f"paired rounds; 95% CI of their geometric mean {low:.3f}..{high:.3f})")


def interval(ratios: List[float]):
    """95% CI of the geometric mean of paired ratios (t on the log ratios)."""
    import math

    from scipy import stats

    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return ratios[0], ratios[0]
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.mean(logs)
    return math.exp(mean - half), math.exp(mean + half)
