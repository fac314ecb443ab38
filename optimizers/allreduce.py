"""`allreduce`: average gradients over all workers with torch's DistributedDataParallel,
which buckets gradients and overlaps their allreduce with the backward pass.

On CPU under an MPI launcher on one machine (--cpu-transport auto) or with
--cpu-transport mpi, each bucket is averaged by MPI's Allreduce instead of gloo's
(commbench.comm.mpi_averager, installed as DDP's comm hook): DDP and its buckets stay,
only the wire changes. Between machines `auto` keeps gloo's ring, which fills a TCP
link, for all but small buckets (commbench.comm.transport). --fp16-allreduce stays on
gloo: MPI has no float16 sum.

As DDP does by default, rank 0's buffers (BatchNorm's running statistics) are broadcast
before every forward pass, so every worker, and the averaged model that evaluation
scores, carries rank 0's statistics; under label skew they describe rank 0's classes
only. --no-broadcast-buffers (DDP's broadcast_buffers=False) keeps each worker's own,
and the averaged model then averages them, as under horovod and neighbor averaging.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Dict

from commbench import spans, wire
from commbench.comm.mpi_averager import MpiAverager
from commbench.comm.transport import (check_cpu_transport, choose_transport,
                                      small_message_facts, small_messages,
                                      transport_for, transport_reason)
from commbench.errors import UsageError
from commbench.flags import flag
from commbench.optimizers.base import Strategy, TrainStep
from commbench.training_step import TrainingStep


@dataclass(frozen=True)
class AllreduceOptions:
    no_broadcast_buffers: bool = flag(False, "keep each worker's own BatchNorm statistics "
                                      "(DDP's broadcast_buffers=False) instead of "
                                      "broadcasting rank 0's before every forward pass")


class Allreduce(Strategy):
    name = "allreduce"
    summary = "average gradients over all workers (torch DDP: bucketed, overlapped with backward)"
    Options = AllreduceOptions

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        check_cpu_transport(config.cpu_transport, launch)
        if config.cpu_transport == "mpi" and config.fp16_allreduce:
            raise UsageError("argument --cpu-transport: mpi cannot carry --fp16-allreduce "
                             "(MPI has no float16 sum); use gloo or auto")

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.transport = ctx.backend if config.fp16_allreduce else \
            choose_transport(config.cpu_transport, ctx)
        self.small_messages = None if config.fp16_allreduce else \
            small_messages(config.cpu_transport, ctx, point_to_point=False)
        self.averager = MpiAverager(ctx.world_size) \
            if self.transport == "mpi" or self.small_messages else None

    def wrap(self, model, optimizer) -> TrainStep:
        from torch.nn.parallel import DistributedDataParallel

        on_gpu = self.ctx.device.type == "cuda"
        # DDP broadcasts rank 0's parameters here, so all workers start equal. Before every
        # forward it broadcasts rank 0's buffers too, unless told not to: newer torch calls
        # that forward_sync_buffers and warns on every rank where broadcast_buffers is passed.
        # Told not to, it still sends the buffers once here, before anything is timed, while
        # they are still equal on every rank.
        sync = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(
            DistributedDataParallel).parameters else "broadcast_buffers"
        ddp = DistributedDataParallel(model, device_ids=[self.ctx.device] if on_gpu else None,
                                      **{sync: not self.options.no_broadcast_buffers})
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if self.config.fp16_allreduce:
            hook = default_hooks.fp16_compress_hook
        elif self.averager is not None:
            hook = self._hook_by_size
        else:  # what DDP does without a hook, through a hook so each bucket is seen
            hook = default_hooks.allreduce_hook
        ddp.register_comm_hook(None, timed(hook, self.ctx.world_size))
        record_buffer_broadcast(ddp, model, self.ctx.world_size, self.ctx.rank == 0)
        return TrainingStep(ddp, optimizer, waits_after_last_piece=True)

    def transport_of(self, bucket) -> str:
        """What carries a bucket: the MPI averager, or torch.distributed's backend."""
        if self.averager is None:
            return self.ctx.backend
        nbytes = bucket.numel() * bucket.element_size()
        over_mpi = transport_for(nbytes, self.transport, self.small_messages) == "mpi"
        return "mpi" if over_mpi else self.ctx.backend

    def _hook_by_size(self, state, bucket):
        """The MPI averager, or for a bucket that goes over gloo DDP's default hook."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if self.transport_of(bucket.buffer()) == "mpi":
            return self.averager.ddp_hook(state, bucket)
        return default_hooks.allreduce_hook(state, bucket)

    def average(self, bucket) -> None:
        """Average one flat bucket in place as the training step does (for microbench):
        DDP's default hook (divide, then all_reduce) or the MPI averager."""
        if self.transport_of(bucket) == "mpi":
            self.averager.average(bucket).wait()
            return
        import torch.distributed as dist

        bucket.div_(self.ctx.world_size)
        dist.all_reduce(bucket)

    def facts(self) -> Dict[str, Any]:
        why = "--fp16-allreduce" if self.config.fp16_allreduce else \
            transport_reason(self.config.cpu_transport, self.transport, self.ctx)
        return {"transport": self.transport, "transport_reason": why,
                **small_message_facts(self.small_messages),
                "fp16": self.config.fp16_allreduce,
                "broadcast_buffers": not self.options.no_broadcast_buffers}


def record_buffer_broadcast(ddp, model, ranks: int, root: bool) -> None:
    """DDP broadcasts rank 0's buffers (BatchNorm's statistics) before every forward
    pass, blocking: a hook on DDP and one on the model it wraps bracket it, and it is
    recorded as a piece and a wait (where a straggler's lateness shows first)."""
    nbytes = sum(b.numel() * b.element_size() for b in model.buffers())
    if not (ddp.broadcast_buffers and nbytes):
        return
    piece = None

    def before(*_):
        nonlocal piece
        piece = spans.record("comm", spans.now(), None, "broadcast buffers", nbytes,
                             sent=wire.broadcast(nbytes, ranks, root))

    def after(*_):
        nonlocal piece
        if piece is not None:
            spans.close(piece)
            spans.record("wait", piece.start, piece.end)
            piece = None

    ddp.register_forward_pre_hook(before)
    model.register_forward_pre_hook(after)


def timed(hook, ranks: int):
    """DDP's comm hook, recording each bucket as a communication piece from the moment
    DDP hands it over to the moment its average is complete (on the wire: a ring
    allreduce over ranks, whichever transport carries it)."""

    def timed_hook(state, bucket):
        if not spans.RECORDER.on:
            return hook(state, bucket)
        buffer = bucket.buffer()
        nbytes = buffer.numel() * buffer.element_size()
        piece = spans.record("comm", spans.now(), None, "allreduce bucket", nbytes,
                             sent=wire.ring_allreduce(nbytes, ranks))
        future = hook(state, bucket)

        def completed(done):
            spans.close(piece)
            return done.value()

        return future.then(completed)

    return timed_hook
