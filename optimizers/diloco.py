"""`diloco`: DiLoCo (Douillard et al., 2023). The run's optimizer is the inner one (a
language model's AdamW, as the paper's, commbench.job.language_recipe; its state stays
each worker's own, as in the paper): every worker steps alone, and after every H-th
step (--average-every) the workers average their pseudo-gradients, the shared
parameters of the last meeting minus their own now, and an outer SGD with Nesterov
momentum (--outer-lr 0.7, --outer-momentum 0.9: the paper's) steps the shared
parameters with that average; every worker goes on from them. --outer-dtype bf16 sends
the pseudo-gradients in bfloat16. BatchNorm's running statistics, which no optimizer
steps, are averaged at each meeting as local_sgd averages them, so that with
--outer-lr 1 and --outer-momentum 0 DiLoCo is local_sgd.

Written on torch primitives rather than on torchft's DiLoCo: that one steps through
torchft's Manager, whose quorum needs torchft's lighthouse server and process groups of
its own beside the launcher's, for the fault tolerance a benchmark does not ask of it.
Its update is this one (tests/test_diloco.py runs both on one model); under
--recovery torchft, where the fault tolerance is the point, a run is torchft's DiLoCo
(commbench.faults.torchft_exchange).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

from commbench.config import compression
from commbench.timing import spans, wire
from commbench.errors import UsageError
from commbench.config.flags import flag, non_negative_float, one_of, positive_float
from commbench.optimizers.local_sgd import PeriodicStrategy, PeriodOptions, average, size_of

OUTER_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class DilocoOptions(PeriodOptions):
    outer_lr: float = flag(0.7, "the outer optimizer's learning rate", positive_float, "LR")
    outer_momentum: float = flag(0.9, "the outer optimizer's Nesterov momentum, below 1 "
                                 "(0: plain SGD)", non_negative_float, "M")
    outer_dtype: str = flag("fp32", "the pseudo-gradients' type on the wire: fp32 or bf16",
                            one_of(OUTER_DTYPES), "TYPE")


class Diloco(PeriodicStrategy):
    name = "diloco"
    summary = ("DiLoCo: local steps; every H steps an outer Nesterov step on the "
               "pseudo-gradients averaged over all workers (--average-every, --outer-lr)")
    Options = DilocoOptions

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        if cls.options_of(config).outer_momentum >= 1:
            raise UsageError("argument --outer-momentum: must be below 1, got "
                             f"{cls.options_of(config).outer_momentum:g}")

    def start(self, model) -> None:
        import torch

        self.parameters = list(model.parameters())
        self.shared = [p.detach().clone() for p in self.parameters]
        momentum = self.options.outer_momentum
        self.outer = torch.optim.SGD(self.shared, lr=self.options.outer_lr,
                                     momentum=momentum, nesterov=momentum > 0)
        self.dtype = torch.bfloat16 if self.options.outer_dtype == "bf16" else torch.float32
        if self.dtype is torch.bfloat16 and \
                not compression.backend_sums_bfloat16(self.shared[0].device):
            raise UsageError(f"argument --outer-dtype: this torch's {self.ctx.backend} "
                             f"(torch {torch.__version__}) cannot sum bfloat16; use fp32")

    def meet(self, started: float) -> None:
        pseudo = self.pseudo_gradients()
        sent = wire.ring_allreduce(size_of([pseudo]), self.ctx.world_size) + \
            wire.ring_allreduce(size_of(self.buffers), self.ctx.world_size)
        piece = spans.record("comm", started, None, "average pseudo-gradients",
                             size_of([pseudo]) + size_of(self.buffers), sent=sent)
        self.outer_step(self.averaged(pseudo))
        if self.buffers:
            average(self.buffers)
        spans.close(piece)

    def pseudo_gradients(self) -> Any:
        """Shared minus own, flat, in the wire's type, divided by the workers (before
        the sum, as DDP's float16 hook divides: a sum of low-precision values overflows
        where their mean does not)."""
        import torch

        with torch.no_grad():
            flat = torch.cat([(s - p).reshape(-1) for s, p in zip(self.shared, self.parameters)])
            return flat.div_(self.ctx.world_size).to(self.dtype)

    def averaged(self, pseudo) -> List[Any]:
        import torch.distributed as dist

        dist.all_reduce(pseudo)
        found, offset = [], 0
        for s in self.shared:
            found.append(pseudo[offset:offset + s.numel()].view_as(s).to(s.dtype))
            offset += s.numel()
        return found

    def outer_step(self, gradients: List[Any]) -> None:
        """The shared parameters take the outer optimizer's step; every worker goes on
        from them."""
        import torch

        for s, g in zip(self.shared, gradients):
            s.grad = g
        self.outer.step()
        with torch.no_grad():
            for p, s in zip(self.parameters, self.shared):
                p.copy_(s)

    def facts(self) -> Dict[str, Any]:
        return {"average_every": self.options.average_every,
                "outer_lr": self.options.outer_lr,
                "outer_momentum": self.options.outer_momentum,
                "outer_dtype": self.options.outer_dtype, **super().facts()}
