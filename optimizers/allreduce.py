"""`allreduce`: average gradients over all workers with torch's DistributedDataParallel,
which buckets gradients and overlaps their allreduce with the backward pass.

On CPU under an MPI launcher on one machine (--cpu-transport auto) or with
--cpu-transport mpi, each bucket is averaged by MPI's Allreduce instead of gloo's
(commbench.comm.mpi_averager, installed as DDP's comm hook): DDP and its buckets stay,
only the wire changes. Between machines `auto` keeps gloo's ring, which fills a TCP
link, for all but small buckets (commbench.comm.transport).

--compression fp16|bf16|powersgd:RANK installs torch's own hook (fp16_compress_hook,
bf16_compress_hook, powerSGD_hook with error feedback and warm start), watched
(commbench.comm.watched_group) so that each allreduce it issues is a piece with the
bytes it carried and its work between them is codec time. A compressed run stays on
torch.distributed's backend: MPI has no float16 sum, and the hooks speak only to a
process group.

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

from commbench.config import compression
from commbench.timing import spans, wire
from commbench.comm.mpi_averager import MpiAverager
from commbench.comm.watched_group import GroupPerBucket, watched
from commbench.comm.transport import (check_cpu_transport, choose_transport,
                                      small_message_facts, small_messages,
                                      transport_for, transport_reason)
from commbench.errors import UsageError
from commbench.config.flags import flag
from commbench.launch.gpus import torch_older_than
from commbench.optimizers.base import Strategy, TrainStep
from commbench.job.training_step import TrainingStep


@dataclass(frozen=True)
class AllreduceOptions:
    no_broadcast_buffers: bool = flag(False, "keep each worker's own BatchNorm statistics "
                                      "(DDP's broadcast_buffers=False) instead of "
                                      "broadcasting rank 0's before every forward pass")


class Allreduce(Strategy):
    name = "allreduce"
    summary = "average gradients over all workers (torch DDP: bucketed, overlapped with backward)"
    Options = AllreduceOptions
    compressions = ("fp16", "bf16", "powersgd")
    restartable = True  # but under PowerSGD, whose error feedback is its own state

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        check_cpu_transport(config.cpu_transport, launch)
        codec = compression.of(config)
        if config.cpu_transport == "mpi" and codec.on:
            raise UsageError(f"argument --cpu-transport: mpi cannot carry --compression {codec} "
                             "(torch's compression hooks speak only to a process group); use "
                             "gloo or auto")
        if codec.kind == "powersgd" and torch_older_than(2, 0):
            raise UsageError(f"argument --compression: {codec} needs torch >= 2.0 here: with "
                             "torch 1.10's PowerSGD hook a full-rank step did not match the "
                             "dense reference (tests/programs/check_strategies.py)")
        if codec.kind == "powersgd" and not config.trains_to_accuracy and \
                codec.start > config.num_warmup_batches:
            # A speed run times compressed steps only, or its img/sec mixes two strategies.
            raise UsageError(f"argument --compression: PowerSGD sends plain allreduce until "
                             f"step {codec.start} (start={codec.start}), after the "
                             f"{config.num_warmup_batches} warm-up batches: timed steps would "
                             f"mix both; give --num-warmup-batches {codec.start} or more")

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.codec = compression.of(config)
        self.transport = ctx.backend if self.codec.on else \
            choose_transport(config.cpu_transport, ctx)
        self.small_messages = None if self.codec.on else \
            small_messages(config.cpu_transport, ctx, point_to_point=False)
        self.averager = MpiAverager(ctx.world_size) \
            if self.transport == "mpi" or self.small_messages else None
        self.powersgd = None  # torch's PowerSGDState, with --compression powersgd:RANK

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
        ddp.register_comm_hook(None, self._hook(model))
        record_buffer_broadcast(ddp, model, self.ctx.world_size, self.ctx.rank == 0)
        return TrainingStep(ddp, optimizer, waits_after_last_piece=True)

    def _hook(self, model):
        """DDP's comm hook: torch's compression hook, watched; else the MPI averager or
        what DDP does without a hook, through a hook so each bucket is seen."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        ranks = self.ctx.world_size
        if self.codec.kind == "powersgd":
            compression.refuse_useless_rank(self.codec, model, self.config.model)
            self.powersgd = powerSGD_hook.PowerSGDState(
                None, matrix_approximation_rank=self.codec.rank,
                start_powerSGD_iter=self.codec.start, min_compression_rate=self.codec.min_rate,
                use_error_feedback=True, warm_start=True, random_seed=self.config.seed)
            # NCCL issues each collective as it is called; gloo's callbacks race.
            groups = GroupPerBucket(ranks) if self.ctx.backend == "gloo" else None
            return watched(powerSGD_hook.powerSGD_hook, self._powersgd_with, ranks, groups)
        if self.codec.on:
            compression.refuse_unsummable(self.codec, self.ctx.device, self.ctx.backend,
                                          "--compression")
            return watched(narrow_hook(self.codec.kind), lambda group: group, ranks)
        if self.averager is not None:
            return timed(self._hook_by_size, ranks)
        return timed(default_hooks.allreduce_hook, ranks)

    def _powersgd_with(self, group):
        self.powersgd.process_group = group
        return self.powersgd

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
        DDP's default hook (divide, then all_reduce), the MPI averager, or with
        --compression fp16|bf16 torch's compression hook."""
        if self.codec.kind in compression.NARROW:
            narrow_hook(self.codec.kind)(None, FlatBucket(bucket)).wait()
            return
        if self.transport_of(bucket) == "mpi":
            self.averager.average(bucket).wait()
            return
        import torch.distributed as dist

        bucket.div_(self.ctx.world_size)
        dist.all_reduce(bucket)

    def facts(self) -> Dict[str, Any]:
        why = f"--compression {self.codec}" if self.codec.on else \
            transport_reason(self.config.cpu_transport, self.transport, self.ctx)
        return {"transport": self.transport, "transport_reason": why,
                **small_message_facts(self.small_messages),
                "fp16": self.codec.kind == "fp16", "compression": str(self.codec),
                **compression.powersgd_facts(self.powersgd),
                "broadcast_buffers": not self.options.no_broadcast_buffers}


def narrow_hook(kind: str):
    """torch's DDP hook that sends a bucket as fp16 or bf16."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {"fp16": default_hooks.fp16_compress_hook,
            "bf16": default_hooks.bf16_compress_hook}[kind]


class FlatBucket:
    """One flat tensor as DDP's hooks see a bucket (they read only its buffer)."""

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer


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
        if not spans.recording():
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
