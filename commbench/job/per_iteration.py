"""What a job measures besides its steps' times, on every rank: after each timed
iteration the means over all workers and the consensus distance (whose samples the
result keeps), where the run diverged, and whether its CPU workers outnumber a
machine's cores."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from commbench.timing import spans
from commbench.job.speed_loop import Timings

if TYPE_CHECKING:  # pragma: no cover
    from commbench.config.run_config import RunConfig


@dataclass(frozen=True)
class IterationMeans:
    """One timed iteration, over all workers."""

    index: int
    img_sec: float  # per worker: the mean over workers of each one's rate
    loss: float  # the mean over workers of each one's last loss
    consensus_distance: Optional[float]  # decentralized strategies only


class AfterIteration:
    """After each timed iteration (outside the timed region), on every rank: the mean
    throughput and loss over all workers, and for decentralized strategies the
    consensus distance, kept in `consensus` for the result and recorded as work between
    steps on the run's recorder; `report` gets them all (rank 0 prints them)."""

    def __init__(self, ctx, config: RunConfig, model, decentralized: bool,
                 report: Callable[[IterationMeans], None], recorder: spans.Recorder):
        self.ctx, self.model, self.report, self.recorder = ctx, model, report, recorder
        self.images = config.batch_size * config.num_batches_per_iter * config.per_sample
        self.decentralized = decentralized
        self.consensus: List[float] = []

    def __call__(self, i: int, timings: Timings) -> None:
        import torch
        import torch.distributed as dist

        sums = torch.tensor([self.images / timings.iteration_seconds[-1], timings.loss[-1]],
                            dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(sums)
        rate, loss = (sums / self.ctx.world_size).tolist()
        distance = None
        if self.decentralized:
            with self.recorder.between("consensus"):
                distance = consensus_distance(self.model, self.ctx.world_size)
            self.consensus.append(distance)
        self.report(IterationMeans(i, rate, loss, distance))


def consensus_distance(model, world_size: int) -> float:
    """Mean over workers of ||x_r - mean x||^2 / ||mean x||^2 (see commbench.result.metrics)."""
    import torch
    import torch.distributed as dist

    x = flat_parameters(model)
    mean = x.clone()  # summed in the parameters' own precision: half the bytes of float64
    dist.all_reduce(mean)
    mean /= world_size
    x, mean = x.double(), mean.double()
    gap = torch.stack([(x - mean).pow(2).sum(), mean.pow(2).sum()])
    dist.all_reduce(gap)  # the second entry is world_size * ||mean||^2
    if not bool(torch.isfinite(gap).all()):
        return math.nan  # a diverged model: no distance to speak of
    return float(gap[0] / gap[1]) if gap[1] > 0 else 0.0


def flat_parameters(model):
    import torch

    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def diverged(first_non_finite: List[Optional[int]]) -> Optional[Dict[str, int]]:
    """Where the run diverged: the first step whose loss was not finite on any rank,
    and the lowest rank that saw it then; None when every loss was finite."""
    seen = [(step, rank) for rank, step in enumerate(first_non_finite) if step is not None]
    if not seen:
        return None
    step, rank = min(seen)
    return {"step": step, "rank": rank}


def oversubscribed(ctx) -> Optional[Dict[str, Any]]:
    """The most loaded machine when CPU workers outnumber its physical cores (each
    worker then shares cores and the run measures CPU sharing, not communication)."""
    from commbench.faults.torchft_group import identity

    if ctx.device.type != "cpu":
        return None  # more ranks than GPUs on a machine is refused at start-up
    host, workers, cores = max(ctx.machine_load(), key=workers_per_core)
    if ctx.world_size == 1:  # a torchft replica group: `commbench torchft` runs all on this host
        workers = identity(ctx.rank, 1)[1]
    return {"machine": host, "workers": workers, "physical_cores": cores} \
        if workers > cores else None


def workers_per_core(load: Tuple[str, int, int]) -> float:
    _host, workers, cores = load  # a machine's (name, workers, physical cores)
    return workers / cores
