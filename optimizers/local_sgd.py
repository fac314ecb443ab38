"""`local_sgd`: every worker steps alone; every H-th step (--average-every) the workers
average their models over all workers: the parameters and BatchNorm's running
statistics, in one flat allreduce after the update. --local-warmup-steps K averages
after each of the first K steps, as post-local SGD does (PyTorch's
PostLocalSGDOptimizer), then every H-th step counted from the end of the warm-up. On
several machines (real, or simulated by --machine-size), --average-every h1,h2 averages
inside each machine every h1-th step and over all every h2-th (PyTorch's
HierarchicalModelAverager's idea, over commbench's machine groups).

What it shares with `diloco` (commbench.optimizers.diloco), the steps alone and the
meeting after every H-th, is PeriodicStrategy. The exchange is torch's own
(torch.distributed.algorithms.model_averaging's average_parameters: flatten, divide,
allreduce, copy back). Its PeriodicModelAverager is not used as it stands: it averages
only parameters that have a gradient, so BatchNorm's statistics would drift apart, and
its warm-up averages nothing, leaving the warm-up's averaging to a DDP gradient hook;
the schedule here is one line instead.

The run's optimizer steps each worker between meetings (a language model's AdamW,
commbench.job.language_recipe): its state stays each worker's own; only the models
meet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Union

from commbench.timing import spans, wire
from commbench.errors import UsageError
from commbench.launch.groups import MachineFlags
from commbench.config.flags import flag, non_negative_int, periods
from commbench.optimizers.base import Strategy, TrainStep
from commbench.optimizers.gradient_allreduce import broadcast_state
from commbench.job.training_step import TrainingStep

AVERAGE_EVERY = 8


@dataclass(frozen=True)
class PeriodOptions:
    average_every: Union[int, List[int]] = flag(
        AVERAGE_EVERY, "average the models over all workers after every H-th step; "
        "local_sgd on several machines: h1,h2 averages inside each machine every h1-th "
        "and over all every h2-th", periods, "H")


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
        if isinstance(every, list):
            cls.check_machine_periods(config, launch)
            every = every[-1]
        measured = config.num_iters * config.num_batches_per_iter
        if not config.trains_to_accuracy and every > measured:
            raise UsageError(f"argument --average-every: {every} steps is more than the "
                             f"{measured} steps this run measures (--num-iters x "
                             "--num-batches-per-iter), which would then time no averaging; "
                             "measure more steps or average more often")

    @classmethod
    def check_training_steps(cls, config, steps: int, bound: str) -> None:
        every = cls.options_of(config).average_every
        first = cls.first_meeting(cls.options_of(config))
        if first > steps:
            shown = ",".join(map(str, every)) if isinstance(every, list) else every
            raise UsageError(f"argument --average-every: {shown} ends no period within the "
                             f"{steps} steps this run trains at most ({bound}): the models "
                             f"would never meet, and the run would be {cls.name} in name "
                             "only; average more often or train longer")

    @classmethod
    def first_meeting(cls, options) -> int:
        """The step after which the workers first meet."""
        every = options.average_every
        return every[0] if isinstance(every, list) else every

    @classmethod
    def check_machine_periods(cls, config, launch) -> None:
        """--average-every h1,h2: this strategy's averaging inside machines."""
        raise UsageError(f"argument --average-every: {cls.name} meets over all workers "
                         "only: give one H")

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.steps = 0
        self.meetings = 0  # recorded: a run that ends before H steps never averaged
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
            self.meetings += 1
            self.meet(started)

    def meet(self, started: float) -> None:
        raise NotImplementedError

    def facts(self) -> Dict[str, Any]:
        return {"meetings": self.meetings}


def size_of(tensors: List[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def average(tensors: List[Any], group: Any = None) -> None:
    """Average tensors over all workers (or a process group's) in one flat allreduce
    (torch's model_averaging helper: flatten, divide, allreduce, copy back)."""
    from torch.distributed.algorithms.model_averaging.utils import average_parameters

    average_parameters(iter(tensors), group)


class LocalSgd(PeriodicStrategy):
    name = "local_sgd"
    summary = ("local SGD: every worker steps alone; the models averaged over all workers "
               "every H steps (--average-every)")
    Options = LocalSgdOptions
    sections = (MachineFlags,)  # --average-every h1,h2: averaging inside each machine

    @classmethod
    def unread(cls, config, launch=None):
        moot = super().unread(config, launch)
        if not isinstance(cls.options_of(config).average_every, list):
            moot["machine_size"] = (f"means nothing to {cls.name} with one period H, which "
                                    "averages over all ranks; only --average-every h1,h2 "
                                    "averages inside machines: leave it out")
        return moot

    @classmethod
    def first_meeting(cls, options) -> int:
        return 1 if options.local_warmup_steps else super().first_meeting(options)

    @classmethod
    def check_machine_periods(cls, config, launch) -> None:
        machine_size = config.machine_size or launch.local_size
        if launch.world_size > 1 and machine_size == launch.world_size:
            raise UsageError("argument --average-every: h1,h2 averages inside machines, but "
                             f"all {launch.world_size} ranks are on one; pass --machine-size "
                             "N to simulate machines of N ranks, or give one H")

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        if isinstance(self.options.average_every, list) and ctx.machine_size == 0:
            # Every rank sees the same hostnames, so every rank stops here alike.
            raise UsageError("argument --average-every: h1,h2 needs the same number of ranks "
                             "on every machine; pass --machine-size N")

    def start(self, model) -> None:
        from commbench.launch.groups import machine_groups

        self.tensors = [*model.parameters(), *self.buffers]
        every = self.options.average_every
        self.inside, self.everywhere = (every[0], every[1]) if isinstance(every, list) \
            else (None, every)
        if self.inside is not None:
            self.machine = machine_groups(self.ctx.machine_size,
                                          self.ctx.world_size)[self.ctx.machine]

    def meets_after(self, step: int) -> bool:
        return self.group_after(step) != "none"

    def group_after(self, step: int) -> str:
        """Over whom the models are averaged after the step-th step: "all", "machine"
        or "none"."""
        since = step - self.options.local_warmup_steps
        if since <= 0 or since % self.everywhere == 0:
            return "all"
        return "machine" if self.inside and since % self.inside == 0 else "none"

    def meet(self, started: float) -> None:
        nbytes = size_of(self.tensors)
        machine = self.group_after(self.steps) == "machine"
        ranks = self.ctx.machine_size if machine else self.ctx.world_size
        piece = spans.record("comm", started, None,
                             "average model inside the machine" if machine else
                             "average model", nbytes, sent=wire.ring_allreduce(nbytes, ranks))
        average(self.tensors, self.machine if machine else None)
        spans.close(piece)

    def facts(self) -> Dict[str, Any]:
        return {"average_every": self.options.average_every,
                "local_warmup_steps": self.options.local_warmup_steps, **super().facts()}
