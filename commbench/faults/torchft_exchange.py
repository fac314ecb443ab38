"""How a strategy's exchange runs through torchft under `--recovery torchft`
(commbench.faults.torchft_group): commbench's flags mapped onto torchft's own classes,
with no quorum and no outer step of commbench's own.

- `allreduce`: torchft's DistributedDataParallel averages the gradients over the
  quorum's groups every step; its OptimizerWrapper asks for the quorum before the step
  and steps the optimizer only where the quorum committed.
- `local_sgd`: torchft.local_sgd.LocalSGD, sync_every = --average-every H. Every group
  steps alone; after every H-th optimizer step the quorum is formed and the parameters
  averaged over it. A sync that is not committed leaves each group's own parameters.
- `diloco`: torchft.local_sgd.DiLoCo over the whole model (one fragment), sync_every =
  H, its outer optimizer torch's SGD with --outer-lr and --outer-momentum (Nesterov when
  above 0), as commbench's own diloco. After every H-th step the quorum is formed, the
  pseudo-gradients (the parameters of the last sync minus a group's own, kept in CPU
  memory) averaged, and the outer step taken from the last sync's parameters; a sync not
  committed puts the parameters back to the last sync's: its H steps are undone.

Either periodic strategy averages the parameters alone: BatchNorm's running statistics,
which commbench's own local_sgd and diloco average at each meeting, stay each group's
own (a group that heals takes its peer's).

What each class hands torchft's Manager to allreduce is counted as it is handed
(`counted`): its bytes, and what gloo's ring over the quorum's groups puts on the wire
(commbench.timing.wire), as commbench's own allreduce is counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from commbench.config.compression import of as compression
from commbench.errors import UsageError
from commbench.job.stop_rule import EVAL_EVERY

STRATEGIES = ("allreduce", "local_sgd", "diloco")
WHOSE = {"allreduce": "DistributedDataParallel", "local_sgd": "LocalSGD", "diloco": "DiLoCo"}


@dataclass(frozen=True)
class Exchange:
    """What the quorum's steps are to the training loop: each stands for `every`
    training steps of each group, the ones since the last; one not committed leaves
    them as the group took them where `keeps_own` (else they are not taken, or undone);
    `meets`: each committed one is a meeting of the strategy's."""

    every: int
    keeps_own: bool
    meets: bool


def of(strategy) -> Exchange:
    if strategy.name == "allreduce":
        return Exchange(1, keeps_own=False, meets=False)
    return Exchange(strategy.options.average_every, keeps_own=strategy.name == "local_sgd",
                    meets=True)


def check(config, strategy_cls) -> None:
    """UsageError for a strategy, or a setting of one, that torchft's classes do not run."""
    if strategy_cls.name not in STRATEGIES:
        raise UsageError(f"argument --recovery: torchft carries {', '.join(STRATEGIES)} here "
                         f"(torchft's {', '.join(WHOSE.values())}), not {strategy_cls.name}")
    if compression(config).on:
        raise UsageError("argument --recovery: torchft's allreduce sends the gradients as they "
                         "are: leave --compression out")
    if config.cpu_transport == "mpi":
        raise UsageError("argument --cpu-transport: torchft's process group is gloo's: leave "
                         "--cpu-transport mpi out")
    if strategy_cls.name == "allreduce":
        return
    options = strategy_cls.options_of(config)
    whose = f"torchft's {WHOSE[strategy_cls.name]}"
    if isinstance(options.average_every, list):
        raise UsageError(f"argument --average-every: {whose} syncs over all replica groups "
                         "alone: give one H")
    if getattr(options, "local_warmup_steps", 0):
        raise UsageError(f"argument --local-warmup-steps: {whose} syncs every H steps from "
                         "the first: leave it out")
    if getattr(options, "outer_dtype", "fp32") != "fp32":
        raise UsageError(f"argument --outer-dtype: {whose} sends the pseudo-gradients in the "
                         "parameters' own type: leave it out")
    every = options.average_every
    if (config.eval_every or EVAL_EVERY) % every:
        # Between syncs the groups' models differ, and each group's evaluation decides
        # when it stops: the groups would stop at different steps.
        raise UsageError(f"argument --eval-every: under --recovery torchft the replica groups "
                         f"of {strategy_cls.name} hold the same parameters only after a sync: "
                         f"evaluate every multiple of --average-every {every}")


def counted(allreduce: Callable[..., Any], quorum) -> Callable[..., Any]:
    """The Manager's `allreduce`, each tensor recorded as handed to it, with what the ring
    allreduce of it over the `quorum`'s process group (its groups, healing ones included,
    which send zeros) puts on the wire; nothing once the Manager errored (it sends none)."""
    from commbench.timing import spans, wire

    def handed(tensor, *args, **kwargs):
        work = allreduce(tensor, *args, **kwargs)  # the quorum formed first
        if spans.recording() and not allreduce.__self__.errored():
            nbytes = tensor.numel() * tensor.element_size()
            at = spans.now()
            spans.record("handed", at, at, "handed to torchft", nbytes,
                         sent=wire.ring_allreduce(nbytes, quorum.size()))
        return work

    return handed


def wrap(manager, model, optimizer, strategy) -> Callable[[Any, Any], Any]:
    """The training step of `strategy`, its exchange torchft's."""
    from commbench.job.training_step import TrainingStep

    if strategy.name == "allreduce":
        from torchft.optim import OptimizerWrapper

        from commbench.faults.torchft_fixes import distributed_data_parallel

        return TrainingStep(distributed_data_parallel(manager, model),
                            OptimizerWrapper(manager, optimizer), waits_after_last_piece=True)
    from torchft.local_sgd import DiLoCo, LocalSGD

    every = strategy.options.average_every
    if strategy.name == "local_sgd":
        averager = LocalSGD(manager, model, optimizer, sync_every=every)
    else:
        import torch

        momentum = strategy.options.outer_momentum
        outer = torch.optim.SGD(model.parameters(), lr=strategy.options.outer_lr,
                                momentum=momentum, nesterov=momentum > 0)
        averager = DiLoCo(manager, [model], optimizer, outer, sync_every=every)
    # Its hooks on the optimizer's step sync every H-th step; they stay for the process's
    # life, which is the run's.
    averager.__enter__()
    return TrainingStep(model, optimizer)
