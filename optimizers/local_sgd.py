"""`local_sgd`: every worker steps alone; every H-th step (--average-every) the workers
average their models over all workers: the parameters and BatchNorm's running
statistics, in one flat allreduce after the update. --local-warmup-steps K averages
after each of the first K steps, as post-local SGD does (PyTorch's
PostLocalSGDOptimizer), then every H-th step counted from the end of the warm-up.

What it shares with `diloco` (commbench.optimizers.diloco), the steps alone and the
meeting after every H-th, is PeriodicStrategy. The exchange is torch's own
(torch.distributed.algorithms.model_averaging's average_parameters: flatten, divide,
allreduce, copy back). Its PeriodicModelAverager is not used as it stands: it averages
only parameters that have a gradient, so BatchNorm's statistics would drift apart, and
its warm-up averages nothing, leaving the warm-up's averaging to a DDP gradient hook;
the schedule here is one line instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

from commbench import spans, wire
from commbench.errors import UsageError
from commbench.flags import flag, non_negative_int, positive_int
from commbench.optimizers.base import Strategy, TrainStep
from commbench.optimizers.gradient_allreduce import broadcast_state
from commbench.training_step import TrainingStep

AVERAGE_EVERY = 8


@dataclass(frozen=True)
class PeriodOptions:
    average_every: int = flag(AVERAGE_EVERY, "average the models over all workers after "
                              "every H-th step", positive_int, "H")


@dataclass(frozen=True)
class LocalSgdOptions(PeriodOptions):
    local_warmup_steps: int = flag(0, "average after each of the first K steps, then every "
                                   "H-th (post-local SGD)", non_negative_int, "K")


class PeriodicStrategy(Strategy):
    """A strategy whose workers step alone and meet after every H-th step, after the
    update: `meet` says what they do then."""

    Options = PeriodOptions
    decentralized = True  # between meetings the workers' models differ

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        every = cls.options_of(config).average_every
        measured = config.num_iters * config.num_batches_per_iter
        if not config.trains_to_accuracy and every > measured:
            raise UsageError(f"argument --average-every: {every} steps is more than the "
                             f"{measured} steps this run measures (--num-iters x "
                             "--num-batches-per-iter), which would then time no averaging; "
                             "measure more steps or average more often")

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.steps = 0
        self.buffers: List[Any] = []  # BatchNorm's statistics: no optimizer steps them

    def wrap(self, model, optimizer) -> TrainStep:
        import torch

        broadcast_state(model)  # every worker starts from rank 0's model, as under DDP
        self.buffers = [b for b in model.buffers() if torch.is_floating_point(b)]
        self.start(model)
        return TrainingStep(model, optimizer, after_update=self.after_update)

    def start(self, model) -> None:
        """What the strategy keeps from the start (called once the workers agree)."""

    def meets_after(self, step: int) -> bool:
        """Whether the workers meet after the step-th step (counted from 1)."""
        return step % self.options.average_every == 0

    def after_update(self, started: float) -> None:
        self.steps += 1
        if self.meets_after(self.steps):
            self.meet(started)

    def meet(self, started: float) -> None:
        raise NotImplementedError


def size_of(tensors: List[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def average(tensors: List[Any]) -> None:
    """Average tensors over all workers in one flat allreduce (torch's model_averaging
    helper: flatten, divide, allreduce, copy back)."""
    from torch.distributed.algorithms.model_averaging.utils import average_parameters

    average_parameters(iter(tensors), None)


class LocalSgd(PeriodicStrategy):
    name = "local_sgd"
    summary = ("local SGD: every worker steps alone; the models averaged over all workers "
               "every H steps (--average-every)")
    Options = LocalSgdOptions

    def start(self, model) -> None:
        self.tensors = [*model.parameters(), *self.buffers]

    def meets_after(self, step: int) -> bool:
        warmup = self.options.local_warmup_steps
        return step <= warmup or (step - warmup) % self.options.average_every == 0

    def meet(self, started: float) -> None:
        nbytes = size_of(self.tensors)
        piece = spans.record("comm", started, None, "average model", nbytes,
                             sent=wire.ring_allreduce(nbytes, self.ctx.world_size))
        average(self.tensors)
        spans.close(piece)

    def facts(self) -> Dict[str, Any]:
        return {"average_every": self.options.average_every,
                "local_warmup_steps": self.options.local_warmup_steps}
