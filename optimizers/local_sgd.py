"""`local_sgd`: every worker steps alone; every H-th step (--average-every) the workers
average their models over all workers: the parameters and BatchNorm's running
statistics, in one flat allreduce after the update. --local-warmup-steps K averages
after each of the first K steps, as post-local SGD does (PyTorch's
PostLocalSGDOptimizer), then every H-th step counted from the end of the warm-up.

The exchange is torch's own (torch.distributed.algorithms.model_averaging's
average_parameters: flatten, divide, allreduce, copy back). Its PeriodicModelAverager
is not used as it stands: it averages only parameters that have a gradient, so
BatchNorm's statistics would drift apart, and its warm-up averages nothing, leaving the
warm-up's averaging to a DDP gradient hook; the schedule here is one line instead.
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
class LocalSgdOptions:
    average_every: int = flag(AVERAGE_EVERY, "average the models over all workers after "
                              "every H-th step", positive_int, "H")
    local_warmup_steps: int = flag(0, "average after each of the first K steps, then every "
                                   "H-th (post-local SGD)", non_negative_int, "K")


class LocalSgd(Strategy):
    name = "local_sgd"
    summary = ("local SGD: every worker steps alone; the models averaged over all workers "
               "every H steps (--average-every)")
    Options = LocalSgdOptions
    decentralized = True  # between averages the workers' models differ

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
        self.tensors: List[Any] = []  # what is averaged: parameters, floating buffers

    def wrap(self, model, optimizer) -> TrainStep:
        import torch

        broadcast_state(model)  # every worker starts from rank 0's model, as under DDP
        self.tensors = [*model.parameters(),
                        *(b for b in model.buffers() if torch.is_floating_point(b))]
        return TrainingStep(model, optimizer, after_update=self.after_update)

    def averages_after(self, step: int) -> bool:
        """Whether the models are averaged after the step-th step (counted from 1)."""
        warmup = self.options.local_warmup_steps
        return step <= warmup or (step - warmup) % self.options.average_every == 0

    def after_update(self, started: float) -> None:
        self.steps += 1
        if self.averages_after(self.steps):
            self.average(started)

    def average(self, started: float) -> None:
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        nbytes = sum(t.numel() * t.element_size() for t in self.tensors)
        piece = spans.record("comm", started, None, "average model", nbytes,
                             sent=wire.ring_allreduce(nbytes, self.ctx.world_size))
        average_parameters(iter(self.tensors), None)
        spans.close(piece)

    def facts(self) -> Dict[str, Any]:
        return {"average_every": self.options.average_every,
                "local_warmup_steps": self.options.local_warmup_steps}

