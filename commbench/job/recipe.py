"""The training recipe: one optimizer and learning-rate schedule for every strategy, so
that two runs of the same configuration differ only in how workers exchange.

A speed run keeps Horovod's and Bluefog's benchmark recipe (SGD, a constant learning
rate of 0.01, momentum 0.9, no weight decay): its numbers stay comparable with theirs.
A run trained to accuracy takes the large-batch recipe of Goyal et al. ("Accurate,
Large Minibatch SGD"): momentum SGD with weight decay, a peak learning rate scaled
linearly with the total batch (0.1 per 256 images), reached by a linear warm-up and
decayed by a cosine to zero over the run's budget (its steps, or its time budget where
no step bound is given). --lr and --weight-decay override the peak and the decay.

A language model takes its own recipe, AdamW's (commbench.job.language_recipe);
`for_speed` and `for_accuracy` below pick the model's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, Union

from commbench.config.flags import flag, non_negative_float, one_of
from commbench.config.sections import Section
from commbench.job.language_recipe import BETAS, LanguageRecipe
from commbench.job.precision import AMP_MODES, AUTO

SPEED_LR = 0.01
BASE_LR = 0.1  # per REFERENCE_BATCH images of the total batch
REFERENCE_BATCH = 256
WEIGHT_DECAY = 5e-4


@dataclass(frozen=True)
class RecipeFlags(Section):
    title = "the training recipe"

    lr: Optional[float] = flag(
        None, "SGD learning rate (default: 0.01 for a speed run, as Horovod's and Bluefog's "
        "benchmarks; training to accuracy: the peak, 0.1 x total batch / 256; see "
        "commbench.job.recipe); a language model's AdamW peak (default 6e-4)",
        non_negative_float)
    momentum: float = flag(0.9, "SGD momentum (not a language model's: AdamW's betas are "
                           "(0.9, 0.95))", non_negative_float)
    weight_decay: Optional[float] = flag(
        None, "SGD weight decay (default: 0 for a speed run; 5e-4 training to accuracy); a "
        "language model's AdamW decoupled weight decay (default 0.1)",
        non_negative_float, "W")
    warmup_epochs: float = flag(
        1.0, "training to accuracy: epochs of linear learning-rate warm-up before the cosine "
        "decay", non_negative_float, "N")
    amp: str = flag(AUTO, "mixed precision: the forward pass under autocast in bf16 (CPU or "
                    "GPU) or fp16 (GPU, with loss scaling); auto: bf16 for a language model "
                    "on a GPU that has it, else off (the result records which)",
                    one_of((AUTO, *AMP_MODES)), "{auto,off,fp16,bf16}")

    @classmethod
    def unread(cls, config) -> Dict[str, str]:
        moot = {}
        if config.language_model:
            moot["momentum"] = (f"{config.model} trains with AdamW (commbench.job."
                                f"language_recipe), whose betas {BETAS} take SGD's "
                                "momentum's place: leave it out")
        if not config.trains_to_accuracy:
            moot["warmup_epochs"] = ("a speed run keeps its learning rate constant; only "
                                     "training to accuracy (--target-accuracy, --time-budget, "
                                     "--max-epochs) warms it up")
        return moot


@dataclass(frozen=True)
class Recipe:
    peak_lr: float
    momentum: float
    weight_decay: float
    lr_rule: str  # how the peak was chosen, in words (recorded)
    warmup_steps: int = 0
    total_steps: Optional[int] = None  # cosine decay over these steps...
    time_budget: Optional[float] = None  # ...or over this much training time
    schedule: str = "constant"  # or "warm-up, then cosine"

    @classmethod
    def for_speed(cls, config) -> "Recipe":
        lr = SPEED_LR if config.lr is None else config.lr
        rule = "--lr" if config.lr is not None else "the benchmarks' constant 0.01"
        return cls(lr, config.momentum, config.weight_decay or 0.0, rule)

    @classmethod
    def for_accuracy(cls, config, total_batch: int, steps_per_epoch: int,
                     max_steps: Optional[int]) -> "Recipe":
        if config.lr is not None:
            lr, rule = config.lr, "--lr"
        else:
            lr = BASE_LR * total_batch / REFERENCE_BATCH
            rule = f"linear scaling: {BASE_LR:g} x {total_batch}/{REFERENCE_BATCH}"
        decay = WEIGHT_DECAY if config.weight_decay is None else config.weight_decay
        warmup = round(config.warmup_epochs * steps_per_epoch)
        if max_steps is not None:
            warmup = min(warmup, max_steps)
        return cls(lr, config.momentum, decay, rule, warmup, max_steps, config.time_budget,
                   "warm-up, then cosine")

    def optimizer(self, parameters):
        import torch

        return torch.optim.SGD(parameters, lr=self.lr_at(0), momentum=self.momentum,
                               weight_decay=self.weight_decay)

    def lr_at(self, step: int, training_seconds: float = 0.0) -> float:
        """The learning rate of step `step` (counted from 0), `training_seconds` into
        the run."""
        if self.schedule == "constant":
            return self.peak_lr
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if self.total_steps is not None:
            left = max(1, self.total_steps - self.warmup_steps)
            progress = (step - self.warmup_steps) / left
        elif self.time_budget:
            progress = training_seconds / self.time_budget
        else:
            progress = 0.0
        return self.peak_lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def scheduler(self, optimizer) -> Callable[[int, float], None]:
        """What sets the learning rate of step `step` before it is taken."""
        return lambda step, training_seconds: self.apply(optimizer, step, training_seconds)

    def describe(self) -> str:
        """The recipe in one line, as the console prints it before training."""
        return (f"Recipe: SGD, momentum {self.momentum:g}, weight decay "
                f"{self.weight_decay:g}; learning rate {self.peak_lr:g} ({self.lr_rule}), "
                f"{self.warmup_steps} warm-up steps, then a cosine decay to 0 over the "
                "budget")

    def apply(self, optimizer, step: int, training_seconds: float) -> None:
        lr = self.lr_at(step, training_seconds)
        for group in optimizer.param_groups:
            group["lr"] = lr

    def facts(self) -> Dict[str, Any]:
        return asdict(self)


AnyRecipe = Union[Recipe, LanguageRecipe]


def for_speed(config) -> AnyRecipe:
    """The recipe of a speed run of config's model."""
    return (LanguageRecipe if config.language_model else Recipe).for_speed(config)


def for_accuracy(config, total_batch: int, steps_per_epoch: int,
                 max_steps: Optional[int]) -> AnyRecipe:
    """The recipe of a run of config's model trained to a target."""
    return (LanguageRecipe if config.language_model else Recipe).for_accuracy(
        config, total_batch, steps_per_epoch, max_steps)
