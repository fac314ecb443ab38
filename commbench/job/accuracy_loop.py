"""Training to accuracy: the loop of a run with --target-accuracy (or --eval-every,
--time-budget, --max-epochs). Workers train from step 0 with no warm-up, since every
step counts towards reaching the target. Every --eval-every steps the training clock
pauses and all workers evaluate, on the task's held-out validation set:

- the averaged model: the mean of all workers' parameters and BatchNorm statistics
  (what a user would deploy), each worker scoring its share of the validation set;
- each worker's own model on the whole set (mean and worst over workers: how far the
  models a decentralized strategy leaves apart have drifted).

A language model (--target-loss) is scored per next token: the averaged model's
validation loss and perplexity besides the accuracies, and its target is a loss.

The run stops at the first evaluation where the averaged model reaches the target,
where the training time passed --time-budget, or at --max-epochs. Every stop decision
is made from values all ranks share (reduced over them), so all ranks stop together.
Two clocks are kept: training time (steps only; evaluation paused) and wall time
(evaluation included, as MLPerf Training counts it); the slowest rank's of each."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from commbench.timing import spans
from commbench.timing.wire import Sent
from commbench.job.per_iteration import consensus_distance
from commbench.faults.recovery_hook import Progress, Recovery
from commbench.job.speed_loop import LossWatch, timed_step
from commbench.job.stop_rule import MAX_EPOCHS, StopRule
from commbench.job.training_step import summed_loss

if TYPE_CHECKING:  # pragma: no cover
    from commbench.config.run_config import RunConfig

EVAL_BATCH = 500  # validation images per forward pass: outside the clock, any size works
# A language model's validation tokens per forward pass: its logits (tokens x vocabulary)
# stay within a few gigabytes for the largest vocabulary.
EVAL_TOKENS = 8192


@dataclass(frozen=True)
class Point:
    """One evaluation: where training stood and how good the models were."""

    step: int
    epoch: float
    samples: int
    training_seconds: float
    wall_seconds: float
    accuracy: float  # the averaged model's
    worker_mean: float
    worker_worst: float
    loss: float  # training loss, mean over ranks and the steps since the last evaluation
    consensus_distance: float
    # bytes each rank put on the wire so far, mean over ranks (commbench.timing.wire); None
    # where an engine communicates out of sight
    bytes_sent: Optional[float] = None
    # a language model's: the averaged model's validation loss (nats per token) and
    # perplexity; its accuracies above are of the next token. None for an image model.
    validation_loss: Optional[float] = None
    perplexity: Optional[float] = None

    def recorded(self) -> Dict[str, Any]:
        """The curve's entry: an image model's without the language model's fields."""
        found = asdict(self)
        if self.validation_loss is None:
            del found["validation_loss"], found["perplexity"]
        return found


def check_length(strategy_cls, config: RunConfig, rule: StopRule, steps_per_epoch: int) -> None:
    """A run bounded in steps that would end before its strategy acts (a periodic one's
    first meeting) is refused on every rank alike, before it trains."""
    if rule.max_steps is not None:
        strategy_cls.check_training_steps(config, rule.max_steps, (
            f"--max-epochs {config.max_epochs or MAX_EPOCHS:g} x {steps_per_epoch} steps per "
            "epoch"))


class Evaluator:
    """Scores the averaged model and this worker's own on the validation set."""

    def __init__(self, model, twin, validation, ctx):
        self.model, self.twin, self.ctx = model, twin, ctx
        images, labels = validation
        self.images, self.labels = images.to(ctx.device), labels.to(ctx.device)

    def __call__(self):
        """(averaged model's accuracy, every worker's own accuracy, averaged model's mean
        loss), the same on all ranks. A language model's are per next token."""
        import torch
        import torch.distributed as dist

        average_into(self.twin, self.model, self.ctx.world_size)
        # this rank's share, taken now: gossip's survivors are fewer ranks than started
        share = torch.arange(self.ctx.rank, len(self.labels), self.ctx.world_size,
                             device=self.ctx.device)
        correct, loss = score(self.twin, self.images[share], self.labels[share])
        own = torch.zeros(self.ctx.world_size + 2, dtype=torch.float64, device=self.ctx.device)
        total = self.labels.numel()
        own[self.ctx.rank] = score(self.model, self.images, self.labels)[0] / total
        own[-2:] = torch.tensor([correct, loss], dtype=torch.float64)
        dist.all_reduce(own)
        return float(own[-2]) / total, own[:-2].tolist(), float(own[-1]) / total


def average_into(twin, model, world_size: int) -> None:
    """twin <- the mean over ranks of model's parameters and floating-point buffers
    (BatchNorm's running statistics); integer buffers (batches seen) are this rank's."""
    import torch
    import torch.distributed as dist

    mine, theirs = model.state_dict(), twin.state_dict()
    floating = [k for k, v in mine.items() if v.is_floating_point()]
    flat = torch.cat([mine[k].detach().reshape(-1).double() for k in floating])
    dist.all_reduce(flat)
    flat /= world_size
    at = 0
    with torch.no_grad():
        for key, value in mine.items():
            if key in floating:
                theirs[key].copy_(flat[at:at + value.numel()].view_as(value))
                at += value.numel()
            else:
                theirs[key].copy_(value)


def score(model, images, labels) -> Tuple[int, float]:
    """(right answers, summed cross-entropy) of the model on the set: per image, or per
    next token for a language model (its logits a row per token, its labels a row per
    sequence)."""
    import torch

    was_training = model.training
    model.eval()
    correct, loss = 0, 0.0
    rows = EVAL_BATCH if labels.dim() == 1 else max(1, EVAL_TOKENS // labels.shape[1])
    try:
        with torch.no_grad():
            for lo in range(0, len(labels), rows):
                logits = model(images[lo:lo + rows]).float()
                wanted = labels[lo:lo + rows].reshape(-1)
                correct += int((logits.argmax(dim=1) == wanted).sum())
                loss += summed_loss(logits, wanted)
    finally:
        model.train(was_training)
    return correct, loss


def train(step: Callable[[int, float], Any], sync: Callable[[], None], rule: StopRule,
          evaluate: Evaluator, model, ctx, samples_per_step: int, steps_per_epoch: int,
          report: Callable[[Point], None], keep_steps: int, recorder: spans.Recorder,
          counts_wire: bool = True, policy: Optional[Recovery] = None) -> Dict[str, Any]:
    """Train until the rule stops it; the curve and how it ended. step(index, training
    seconds so far) takes one training step and returns its loss. Every step is a span
    on the recorder and so is every evaluation; the spans of the last `keep_steps` steps
    are kept, and what every step put on the wire is counted (unless counts_wire is
    False: an engine communicates out of sight). The recovery policy
    (commbench.faults.recovery_hook) says where training starts and hears of every step,
    after its evaluation: a restart resumes from a checkpoint, a torchft group takes up a
    peer's progress as it heals and counts only the steps its quorum committed, gossip's
    survivors do not count the samples of the ranks they lost."""
    policy = policy or Recovery()
    watch = LossWatch()
    curve, training, losses, steps, started = resumed(policy.start)
    recorder.sent += Sent(policy.start.bytes_sent, 0)  # a restarted job's earlier attempts'
    while True:
        loss, seconds = timed_step(lambda: step(steps, training), sync, recorder)
        healed = policy.healed()
        if healed is not None:  # a torchft group took up a peer's state in this step
            curve, training, losses, steps, started = resumed(healed)  # to this step's end
        training += seconds
        losses.append(watch.see(loss))
        if not policy.committed():
            continue  # the quorum did not commit it: the model did not change
        steps += 1
        if not steps % rule.eval_every or steps == rule.max_steps:
            recorder.keep_last(keep_steps)
            point = _evaluation(evaluate, model, ctx, recorder, rule, steps, training, started,
                                losses, samples_per_step, steps_per_epoch, counts_wire)
            missed = policy.samples_missed(steps)
            if missed:
                point = replace(point, samples=point.samples - missed)
            curve.append(point)
            report(point)
            losses = []
            diverged = first_divergence(watch.first_non_finite, ctx)
            stopped_by = policy.agreed(steps, "diverged" if diverged else rule.why_stop(point))
            if stopped_by:
                return {**outcome(curve, rule, stopped_by, samples_per_step), "diverged": diverged}
        policy.after_step(Progress(steps, training, time.perf_counter() - started,
                                   list(curve), list(losses), recorder.sent.nbytes))


def resumed(start: Progress) -> Tuple[List[Point], float, List[float], int, float]:
    """(curve, training seconds, losses since the last evaluation, steps, when the wall
    clock started) of a loop taken up where `start` says training stood."""
    return ([p if isinstance(p, Point) else Point(**p) for p in start.curve],
            start.training_seconds, list(start.losses),
            start.steps, time.perf_counter() - start.wall_seconds)


def _evaluation(evaluate: Evaluator, model, ctx, recorder: spans.Recorder, rule: StopRule,
                steps: int, training: float, started: float, losses: List[float],
                samples_per_step: int, steps_per_epoch: int, counts_wire: bool) -> Point:
    """The point of an evaluation after `steps` steps, the same on every rank."""
    import torch
    import torch.distributed as dist

    with recorder.between("evaluate"):
        accuracy, own, validation_loss = evaluate()
    shared = torch.tensor([training, time.perf_counter() - started],
                          dtype=torch.float64, device=ctx.device)
    dist.all_reduce(shared, op=dist.ReduceOp.MAX)  # the slowest rank's clocks
    mean_loss = torch.tensor([sum(losses) / len(losses), recorder.sent.nbytes],
                             dtype=torch.float64, device=ctx.device)
    dist.all_reduce(mean_loss)  # then divided: the means over ranks
    with recorder.between("consensus"):
        distance = consensus_distance(model, ctx.world_size)
    return Point(steps, steps / steps_per_epoch, steps * samples_per_step,
                 float(shared[0]), float(shared[1]), accuracy, sum(own) / len(own),
                 min(own), float(mean_loss[0]) / ctx.world_size, distance,
                 float(mean_loss[1]) / ctx.world_size if counts_wire else None,
                 *language_loss(rule, validation_loss))


def language_loss(rule: StopRule, loss: float) -> Tuple[Optional[float], Optional[float]]:
    """(validation loss, perplexity) of a language model's evaluation; (None, None) for
    an image model's, whose curve records accuracy alone."""
    if rule.metric != "loss":
        return None, None
    return loss, math.exp(loss) if loss < 700 else math.inf  # exp overflows past ~709


def first_divergence(mine: Optional[int], ctx) -> Optional[Dict[str, int]]:
    """The first step whose loss was not finite on any rank, and the lowest rank that saw
    it then (the same on all ranks); None while every rank's loss is finite."""
    import torch
    import torch.distributed as dist

    # step * world_size + rank: one MIN reduce finds both, exactly in float64
    key = math.inf if mine is None else float(mine * ctx.world_size + ctx.rank)
    found = torch.tensor([key], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(found, op=dist.ReduceOp.MIN)
    if math.isinf(float(found)):
        return None
    step, rank = divmod(int(found), ctx.world_size)
    return {"step": step, "rank": rank}


def outcome(curve: List[Point], rule: StopRule, stopped_by: str,
            samples_per_step: int) -> Dict[str, Any]:
    """The summary of a curve: time, steps, epochs and samples to the target, or "not
    reached" with the best accuracy (never a time). A language model's target is a loss:
    its summary says so, with the best loss, and counts tokens as its samples."""
    last = curve[-1]
    reached = stopped_by == "target"
    best = max(curve, key=lambda p: p.accuracy)
    found = {
        "target_accuracy": rule.target if rule.metric == "accuracy" else None,
        "reached": reached if rule.target is not None else None,
        "time_to_target": last.training_seconds if reached else None,
        "wall_time_to_target": last.wall_seconds if reached else None,
        "steps_to_target": last.step if reached else None,
        "epochs_to_target": last.epoch if reached else None,
        "samples_to_target": last.samples if reached else None,
        "bytes_to_target": last.bytes_sent if reached else None,
        "bytes_sent": last.bytes_sent,
        "best_accuracy": best.accuracy,
        "best_at_step": best.step,
        "final_worker_worst": last.worker_worst,
        "stopped_by": stopped_by,
        "steps": last.step,
        "training_seconds": last.training_seconds,
        "wall_seconds": last.wall_seconds,
        "img_sec": last.samples / last.training_seconds if last.training_seconds else None,
        "eval_every": rule.eval_every,
        "max_steps": rule.max_steps,
        "time_budget": rule.time_budget,
        "curve": [p.recorded() for p in curve],
    }
    if rule.metric == "loss":
        # a diverged run's NaN losses would make min() depend on the order
        lowest = min((p for p in curve if math.isfinite(p.validation_loss)), default=last,
                     key=lambda p: p.validation_loss)
        found.update(target_loss=rule.target, best_loss=lowest.validation_loss,
                     best_loss_at_step=lowest.step, best_perplexity=lowest.perplexity,
                     unit="tokens")
    return found
