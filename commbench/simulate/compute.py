"""The compute of one training step: how long its forward, backward and optimizer
phases take (measured by a run's compute-only reference, or stated as one device's
img/sec), the spread of per-batch times (for stragglers), and the model's gradients:
their sizes, the point of the backward pass at which each is ready, and DDP's buckets.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from commbench.errors import UsageError

ELEMENT_BYTES = 4  # float32 parameters and gradients
# DDP's defaults: its first bucket is small so that communication starts early.
DDP_BUCKET_CAPS = (1 << 20, 25 << 20)


@dataclass(frozen=True)
class Gradients:
    """A model's parameters in the order backward produces their gradients: bytes of
    each, and the share of the backward pass done when it is ready."""

    nbytes: Tuple[int, ...]
    ready: Tuple[float, ...]
    forward_share: float  # forward FLOPs / (forward + backward FLOPs)
    shapes: Tuple[Tuple[int, ...], ...] = ()  # each parameter's, in the same order

    @property
    def total(self) -> int:
        return sum(self.nbytes)

    def buckets(self, caps: Sequence[int] = DDP_BUCKET_CAPS) -> List[Tuple[int, float]]:
        """(bytes, ready share) of DDP's buckets, in the order DDP launches them."""
        return [(sum(self.nbytes[i] for i in bucket), max(self.ready[i] for i in bucket))
                for bucket in self.bucket_indices(caps)]

    def bucket_indices(self, caps: Sequence[int] = DDP_BUCKET_CAPS) -> List[List[int]]:
        """The parameters of each of DDP's buckets, in the order DDP launches them."""
        import torch
        import torch.distributed as dist

        tensors = [torch.empty(n // ELEMENT_BYTES, device="meta") for n in self.nbytes]
        indices, _ = dist._compute_bucket_assignment_by_size(tensors, list(caps),
                                                             [False] * len(tensors))
        return [list(bucket) for bucket in indices]


@functools.lru_cache(maxsize=32)
def gradients(model: str, image_size: int, num_classes: int = 1000) -> Gradients:
    """The model's gradients, from one forward and backward pass on the meta device
    (no memory, no compute): the gradient of a module's parameters is ready when
    backward has passed through it, and backward passes modules in reverse order
    of their forward pass, each taking its share of the backward FLOPs."""
    import torch

    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        raise UsageError("commbench simulate needs torch >= 2.1 (torch.utils.flop_counter) "
                         "to read a model's layout") from None
    from commbench.job.models import build_model

    with torch.device("meta"):
        net = build_model(model, num_classes)
    order: List[str] = []
    leaves = {name: m for name, m in net.named_modules() if not list(m.children())}
    hooks = [m.register_forward_hook(lambda *_, name=name: order.append(name))
             for name, m in leaves.items()]
    images = torch.empty(2, 3, image_size, image_size, device="meta")  # BN needs 2
    with FlopCounterMode(display=False, depth=None) as forward:
        logits = net(images)
    for hook in hooks:
        hook.remove()
    with FlopCounterMode(display=False, depth=None) as backward:
        logits.sum().backward()
    root = type(net).__name__
    flops = forward.get_flop_counts()
    done, ready_of = 0.0, {}
    cost = [sum(flops.get(f"{root}.{name}", {}).values()) for name in order]
    total = float(sum(cost)) or 1.0
    for name, c in zip(reversed(order), reversed(cost)):
        done += c / total
        ready_of[name] = min(done, 1.0)  # a module run twice: after its last backward
    params = [(ready_of.get(name.rpartition(".")[0], 1.0), p.numel() * ELEMENT_BYTES,
               tuple(p.shape)) for name, p in net.named_parameters()]
    params.sort(key=lambda rp: rp[0])
    forward_flops = sum(flops.get("Global", {}).values())
    backward_flops = sum(backward.get_flop_counts().get("Global", {}).values())
    return Gradients(tuple(b for _, b, _ in params), tuple(r for r, _, _ in params),
                     forward_flops / max(forward_flops + backward_flops, 1),
                     tuple(s for _, _, s in params))


@dataclass(frozen=True)
class Compute:
    """One worker's compute per step: mean seconds of each phase, and samples of whole
    batch times (their spread gives the straggler term; empty when stated)."""

    forward: float
    backward: float
    optimizer: float
    batch_samples: Tuple[float, ...] = ()
    mean_ci: float = 0.0  # half-width of the 95% interval of the mean batch time
    source: str = ""

    @property
    def seconds(self) -> float:
        return self.forward + self.backward + self.optimizer

    def scaled(self, factor: float) -> "Compute":
        return Compute(self.forward * factor, self.backward * factor, self.optimizer * factor,
                       tuple(s * factor for s in self.batch_samples), self.mean_ci * factor,
                       self.source)

    def bound(self, side: int) -> "Compute":
        """The compute at the fast (-1) or slow (+1) end of its mean's interval."""
        return self.scaled(1 + side * self.mean_ci / self.seconds) if self.mean_ci else self

    def slowest_of(self, k: float) -> float:
        """Expected excess of the slowest of k workers' batch times over the mean: the
        empirical distribution's E[max of k draws] - E[draw]."""
        if k <= 1 or not self.batch_samples:
            return 0.0
        x = np.sort(np.asarray(self.batch_samples))
        cdf = np.arange(1, len(x) + 1) / len(x)
        below = np.concatenate([[0.0], cdf[:-1]])
        return float((x * (cdf ** k - below ** k)).sum() - x.mean())


def stated(img_sec: float, batch_size: int, forward_share: float, source: str) -> Compute:
    """One device's stated throughput, split into phases by FLOPs (no optimizer time)."""
    step = batch_size / img_sec
    return Compute(step * forward_share, step * (1 - forward_share), 0.0, (), 0.0, source)


def measured(batch_seconds: Sequence[float], phase_seconds: Optional[Sequence], forward_share:
             float, source: str) -> Compute:
    """A reference's per-batch times, split by its measured phase shares (or by FLOPs
    when the file predates them)."""
    from commbench.result import metrics

    samples = tuple(float(s) for s in batch_seconds)
    mean = float(np.mean(samples))
    if phase_seconds:
        shares = np.asarray(phase_seconds, dtype=float).reshape(-1, 3).sum(axis=0)
        shares = shares / shares.sum()
    else:
        shares = np.array([forward_share, 1 - forward_share, 0.0])
        source += " (phases split by FLOPs)"
    ci = metrics.ci95_halfwidth(samples) or 0.0
    return Compute(*(mean * shares), samples, ci, source)
