"""When a run trained to a target evaluates and when it stops: the flags of training to
a target (an image model's accuracy, a language model's loss) and the rule they make,
in steps and training seconds (commbench.job.accuracy_loop runs it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

from commbench.config.flags import flag, fraction, positive_float, positive_int
from commbench.config.sections import Section

if TYPE_CHECKING:  # pragma: no cover
    from commbench.config.run_config import RunConfig
    from commbench.job.accuracy_loop import Point

# How often the models are evaluated, and the bound on a run given neither --max-epochs
# nor --time-budget.
EVAL_EVERY = 20
MAX_EPOCHS = 20.0


@dataclass(frozen=True)
class AccuracyFlags(Section):
    title = "training to accuracy (instead of timing iterations)"

    target_accuracy: Optional[float] = flag(
        None, "train to accuracy instead of timing iterations: end the run when the "
        "workers' averaged model reaches this validation accuracy (needs --data other than "
        "synthetic)",
        fraction, "X")
    eval_every: Optional[int] = flag(
        None, "training to accuracy: evaluate every N steps, the clock paused (default: "
        f"{EVAL_EVERY})", positive_int, "STEPS")
    time_budget: Optional[float] = flag(
        None, "training to accuracy: stop after this much training time (checked at each "
        "evaluation)", positive_float, "SECONDS")
    max_epochs: Optional[float] = flag(
        None, "training to accuracy: stop after this many passes over the training set "
        f"(default: {MAX_EPOCHS} when no --time-budget is given)", positive_float, "N")
    target_loss: Optional[float] = flag(
        None, "a language model's --target-accuracy: end the run when the workers' averaged "
        "model's validation loss (nats per token) is at most X (needs --data language, "
        "above the floor it prints, or text:PATH)", positive_float, "X")

    @classmethod
    def unread(cls, config) -> Dict[str, str]:
        if config.language_model is not None:
            return {"target_accuracy": f"{config.model} is a language model: its target is a "
                    "validation loss in nats per token (--target-loss), not an accuracy"}
        return {"target_loss": f"{config.model} is an image model: its target is an accuracy "
                "(--target-accuracy); --target-loss is a language model's"}

    @property
    def trains_to_accuracy(self) -> bool:
        """Whether this run trains to accuracy rather than timing iterations."""
        return any(getattr(self, name) is not None for name in AccuracyFlags.names())


@dataclass(frozen=True)
class StopRule:
    """When to evaluate and when to stop, in steps and training seconds."""

    target: Optional[float]
    eval_every: int
    max_steps: Optional[int]  # None: bounded by time_budget alone
    time_budget: Optional[float]
    # what the target is of: the averaged model's "accuracy" (at least the target) or,
    # for a language model, its validation "loss" (at most the target)
    metric: str = "accuracy"

    @classmethod
    def of(cls, config: RunConfig, steps_per_epoch: int) -> "StopRule":
        epochs = config.max_epochs
        if epochs is None and config.time_budget is None:
            epochs = MAX_EPOCHS
        max_steps = None if epochs is None else max(1, round(epochs * steps_per_epoch))
        if config.language_model is not None:
            return cls(config.target_loss, config.eval_every or EVAL_EVERY, max_steps,
                       config.time_budget, "loss")
        return cls(config.target_accuracy, config.eval_every or EVAL_EVERY, max_steps,
                   config.time_budget)

    def why_stop(self, point: "Point") -> Optional[str]:
        if self.target is not None and (point.validation_loss <= self.target
                                        if self.metric == "loss"
                                        else point.accuracy >= self.target):
            return "target"
        if self.max_steps is not None and point.step >= self.max_steps:
            return "max epochs"
        if self.time_budget is not None and point.training_seconds >= self.time_budget:
            return "time budget"
        return None
