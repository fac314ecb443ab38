"""The language models' recipe (--model lm-tiny, gpt2-small, llama-1b): AdamW, gradients
clipped to a global norm, a linear warm-up and a cosine decay, as nanoGPT's train.py
and torchtitan's defaults train GPT-2 and Llama. Every strategy gets the same one, as
image models all get commbench.job.recipe's.

- AdamW (torch.optim.AdamW, decoupled weight decay): peak learning rate 6e-4 (nanoGPT's
  for GPT-2 124M), betas (0.9, 0.95) and weight decay 0.1 (nanoGPT's and torchtitan's),
  eps 1e-8 (torch's and torchtitan's). --lr and --weight-decay override the peak and the
  decay; --momentum, SGD's, is refused (AdamW's betas take its place).
- Clipping to a global norm of 1.0 (nanoGPT's grad_clip, torchtitan's max_norm) with
  torch's clip_grad_norm_, inside the optimizer's step: every strategy calls that step
  after its gradient exchange (DDP's buckets, gradient_allreduce's wait, Horovod's
  synchronize), so the averaged gradient is clipped; strategies that exchange
  parameters (the neighbor averaging ones, local_sgd, diloco) clip each worker's own.
  Under --amp fp16 GradScaler unscales the gradients before this step, so the clipping
  sees true gradients.
- Training to a target: --warmup-epochs of linear warm-up, then a cosine decay to a
  tenth of the peak (nanoGPT's min_lr, after Chinchilla) over the run's step bound,
  with torch's LinearLR, CosineAnnealingLR and SequentialLR. A run bounded by a time
  budget alone has no step count for the cosine to end at: it keeps the peak after the
  warm-up (said in the recorded `schedule`).
- A speed run keeps the peak constant, as the image models' speed recipe does: the
  timed steps then all take the same update, whatever the run's length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, Tuple


PEAK_LR = 6e-4
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
EPS = 1e-8
MAX_GRAD_NORM = 1.0
MIN_LR_FRACTION = 0.1

CONSTANT = "constant"
COSINE = "warm-up, then cosine to a tenth of the peak"
NO_BOUND = "warm-up, then constant (no step bound for a cosine to end at)"


@dataclass(frozen=True)
class LanguageRecipe:
    """What a language model's run trains with; recorded as the result's `recipe`."""

    peak_lr: float
    weight_decay: float
    lr_rule: str  # how the peak was chosen, in words (recorded)
    warmup_steps: int = 0
    total_steps: Optional[int] = None  # the cosine ends here
    schedule: str = CONSTANT
    optimizer_name: str = "AdamW"
    betas: Tuple[float, float] = BETAS
    eps: float = EPS
    max_grad_norm: float = MAX_GRAD_NORM
    min_lr: float = 0.0

    @classmethod
    def for_speed(cls, config) -> "LanguageRecipe":
        lr, rule = _peak(config)
        return cls(lr, _decay(config), rule, min_lr=lr)

    @classmethod
    def for_accuracy(cls, config, total_batch: int, steps_per_epoch: int,
                     max_steps: Optional[int]) -> "LanguageRecipe":
        """total_batch is unused: nanoGPT's peak is given for its batch, not scaled."""
        lr, rule = _peak(config)
        warmup = round(config.warmup_epochs * steps_per_epoch)
        if max_steps is not None:
            warmup = min(warmup, max_steps)
        return cls(lr, _decay(config), rule, warmup, max_steps,
                   COSINE if max_steps is not None else NO_BOUND,
                   min_lr=lr * MIN_LR_FRACTION if max_steps is not None else lr)

    def optimizer(self, parameters):
        import torch

        return clipped(torch.optim.AdamW, self.max_grad_norm)(
            parameters, lr=self.peak_lr, betas=self.betas, eps=self.eps,
            weight_decay=self.weight_decay)

    def scheduler(self, optimizer) -> Callable[[int, float], None]:
        """What sets the learning rate of step `step` (counted from 0) before it is taken:
        torch's schedulers, stepped once per step on an optimizer of their own, whose rate
        is copied. torch's schedulers step on from the rate they find, so run on the
        trained optimizer they would build on a rate loaded with a checkpoint or a peer's
        state (a restart, a heal, a rejoin) instead of the step's own."""
        import torch

        if self.schedule == CONSTANT:
            return lambda step, training_seconds: None

        def fresh():
            own = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=self.peak_lr)
            schedule = self._schedule(own)
            own.step()  # no gradient, no change: torch's schedulers ask for a step first
            return own, schedule

        chain = [fresh()]

        def set_for(step: int, training_seconds: float) -> None:
            own, schedule = chain[0]
            if schedule.last_epoch > step:  # an earlier step again (an undone sync)
                own, schedule = chain[0] = fresh()
            while schedule.last_epoch < step:
                schedule.step()
            for group in optimizer.param_groups:
                group["lr"] = own.param_groups[0]["lr"]

        return set_for

    def _schedule(self, optimizer):
        """The warm-up and the decay as torch's schedulers, on `optimizer`."""
        from torch.optim import lr_scheduler

        phases, milestones = [], []
        if self.warmup_steps:
            phases.append(lr_scheduler.LinearLR(optimizer, 1 / self.warmup_steps, 1.0,
                                                self.warmup_steps - 1))
            milestones.append(self.warmup_steps)
        if self.total_steps is not None:
            phases.append(lr_scheduler.CosineAnnealingLR(
                optimizer, max(1, self.total_steps - self.warmup_steps), self.min_lr))
        else:
            phases.append(lr_scheduler.ConstantLR(optimizer, 1.0))
        return phases[0] if len(phases) == 1 else \
            lr_scheduler.SequentialLR(optimizer, phases, milestones)

    def describe(self) -> str:
        """The recipe in one line, as the console prints it before training."""
        schedule = "constant" if self.schedule == CONSTANT else \
            f"{self.warmup_steps} warm-up steps, then {self.schedule.split(', then ')[-1]}"
        return (f"Recipe: AdamW, betas {self.betas}, eps {self.eps:g}, weight decay "
                f"{self.weight_decay:g}, gradients clipped to norm {self.max_grad_norm:g}; "
                f"learning rate {self.peak_lr:g} ({self.lr_rule}), {schedule}")

    def facts(self) -> Dict[str, Any]:
        return asdict(self)


def clipped(optimizer_class, max_norm: float):
    """optimizer_class whose step first clips its gradients to a global norm of max_norm.
    A class, not a wrapper: Horovod's and Bluefog's optimizers derive from the class
    they are given and reach this step through super() after their exchange."""
    import torch

    def step(self, closure=None):
        grads = [p for group in self.param_groups for p in group["params"]
                 if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(grads, max_norm)
        return optimizer_class.step(self, closure)

    return type(optimizer_class.__name__, (optimizer_class,), {"step": step})


def _peak(config) -> Tuple[float, str]:
    if config.lr is not None:
        return config.lr, "--lr"
    return PEAK_LR, f"nanoGPT's {PEAK_LR:g} for GPT-2"


def _decay(config) -> float:
    return WEIGHT_DECAY if config.weight_decay is None else config.weight_decay
