"""`gradient_allreduce`: Bluefog's gradient averaging (DistributedGradientAllreduceOptimizer).

The same mathematics as `allreduce`, done on Bluefog's terms rather than DDP's: one
asynchronous allreduce per parameter, launched from a hook the moment backward has
accumulated that parameter's gradient, all waited for before the optimizer step.
No buckets: comparing it with `allreduce` shows what DDP's bucketing buys.
--compression fp16|bf16 sends each gradient divided, then cast (DDP's hooks cast first:
a gradient beyond float16's range becomes inf there, here its average stays finite).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from commbench.config import compression
from commbench.timing import spans, wire
from commbench.optimizers.base import Strategy, TrainStep
from commbench.job.training_step import TrainingStep


class GradientAllreduce(Strategy):
    name = "gradient_allreduce"
    summary = ("Bluefog's gradient averaging: one asynchronous allreduce per gradient, "
               "launched from hooks during backward")
    compressions = ("fp16", "bf16")

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.averager = None  # the GradientAverager, after wrap

    def wrap(self, model, optimizer) -> TrainStep:
        # Bluefog's benchmark (like DDP) starts every worker from rank 0's model.
        broadcast_state(model)
        codec = compression.of(self.config)
        compression.refuse_unsummable(codec, self.ctx.device, self.ctx.backend, "--compression")
        self.averager = GradientAverager(model, self.ctx.world_size, codec.wire_dtype())
        # its hooks launch one allreduce per gradient as backward produces it
        return TrainingStep(model, optimizer, before_update=lambda at: self.averager.wait())

    def facts(self) -> Dict[str, Any]:
        codec = compression.of(self.config)
        return {"fp16": codec.kind == "fp16", "compression": str(codec),
                "messages": "one per parameter"}


def broadcast_state(model) -> None:
    """Every parameter and buffer from rank 0, one tensor at a time (once, untimed)."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, 0)


class GradientAverager:
    """Hooks that allreduce each parameter's gradient as soon as backward produced it.

    torch.distributed matches collectives by the order they are issued, so every
    rank must produce gradients in the same order: true for one model run on
    same-shaped inputs, which is what a benchmark does.
    """

    # torch >= 2.1 has a hook for exactly this; the check program turns it off to
    # exercise the path torch 1.10 takes.
    use_post_accumulate_grad_hook = True

    def __init__(self, model, world_size: int, narrow=None):
        self.world_size = world_size
        self.narrow = narrow  # the torch dtype gradients travel in; None: their own
        self.params = [p for p in model.parameters() if p.requires_grad]
        # id(param) -> (work, sent tensor, its communication piece while recording)
        self._pending: Dict[int, Tuple[Any, Any, Any]] = {}
        self._keep_alive: List[Any] = []
        self.late = 0  # gradients of the last step no hook launched (they should be none)
        for p in self.params:
            self._register(p)

    def _register(self, p) -> None:
        if self.use_post_accumulate_grad_hook and hasattr(p, "register_post_accumulate_grad_hook"):
            p.register_post_accumulate_grad_hook(self._launch)
            return
        # torch < 2.1 (Horovod's and Bluefog's way): a hook on the node that
        # accumulates p's gradient, which runs after p.grad is written. The node
        # must be kept alive, or the hook goes with it.
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        accumulator.register_hook(lambda *_, param=p: self._launch(param))
        self._keep_alive.append(accumulator)

    def _launch(self, p) -> None:
        import torch.distributed as dist

        # In a narrow type, divide before the sum: a sum of n float16 gradients can
        # overflow where their average does not.
        sent = p.grad.div(self.world_size).to(self.narrow) if self.narrow else p.grad
        nbytes = sent.numel() * sent.element_size()
        piece = spans.record("comm", spans.now(), None, "allreduce gradient", nbytes,
                             sent=wire.ring_allreduce(nbytes, self.world_size)) \
            if spans.recording() else None
        self._pending[id(p)] = (dist.all_reduce(sent, async_op=True), sent, piece)

    def wait(self) -> None:
        """Block until every gradient is the average over all workers."""
        import torch

        self.late = 0
        for p in self.params:
            if id(p) not in self._pending:
                self.late += 1
                # No gradient this step (an unused branch): contribute zeros, so that
                # every rank issues the same collectives.
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._launch(p)
            work, sent, piece = self._pending.pop(id(p))
            work.wait()
            spans.close(piece)
            if sent is p.grad:
                p.grad.div_(self.world_size)
            else:
                p.grad.copy_(sent)  # already the average
