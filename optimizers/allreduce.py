"""`allreduce`: average gradients over all workers with torch's DistributedDataParallel,
which buckets gradients and overlaps their allreduce with the backward pass.

On CPU under an MPI launcher (--cpu-transport auto or mpi) each bucket is averaged by
MPI's Allreduce (mpi4py, on the bucket's memory) instead of gloo's: DDP and its
buckets stay, only the wire changes — on this machine MPI's Allreduce of 64 MB over
4 ranks takes ~0.6x gloo's time (`commbench microbench --op allreduce`). One
background thread issues the Allreduces in the order DDP hands over buckets (bucket
order, the same on every rank), so backward goes on computing meanwhile, as it does
beside gloo's own thread. --fp16-allreduce stays on gloo: MPI has no float16 sum.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Dict

from commbench.errors import UsageError
from commbench.optimizers.base import Strategy, TrainStep, local_step
from commbench.optimizers.decentralized import check_cpu_transport
from commbench.optimizers.neighbor_exchange import choose_transport


class Allreduce(Strategy):
    name = "allreduce"
    summary = "average gradients over all workers (torch DDP: bucketed, overlapped with backward)"

    @classmethod
    def check(cls, config, launch) -> None:
        check_cpu_transport(config.cpu_transport, launch)
        if config.cpu_transport == "mpi" and config.fp16_allreduce:
            raise UsageError("argument --cpu-transport: mpi cannot carry --fp16-allreduce "
                             "(MPI has no float16 sum); use gloo or auto")

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.transport = ctx.backend if config.fp16_allreduce else \
            choose_transport(config.cpu_transport, ctx)
        self.averager = MpiAverager(ctx.world_size) if self.transport == "mpi" else None

    def wrap(self, model, optimizer) -> TrainStep:
        from torch.nn.parallel import DistributedDataParallel

        on_gpu = self.ctx.device.type == "cuda"
        # DDP broadcasts rank 0's parameters here, so all workers start equal.
        ddp = DistributedDataParallel(model, device_ids=[self.ctx.device] if on_gpu else None)
        if self.config.fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.averager is not None:
            ddp.register_comm_hook(None, self.averager.ddp_hook)
        return local_step(ddp, optimizer)

    def average(self, bucket) -> None:
        """Average one flat bucket in place as the training step does (for microbench):
        DDP's default hook (divide, then all_reduce) or the MPI averager."""
        if self.averager is not None:
            self.averager.average(bucket).wait()
            return
        import torch.distributed as dist

        bucket.div_(self.ctx.world_size)
        dist.all_reduce(bucket)

    def facts(self) -> Dict[str, Any]:
        return {"transport": self.transport, "fp16": self.config.fp16_allreduce}


# Each bucket is summed and divided in pieces of this size: dividing a piece right
# after its Allreduce, while it is in cache, saves a separate pass over the bucket.
# 64 MB over 4 ranks here (`commbench microbench --op allreduce -b 64M -e 64M`): one
# Allreduce of the whole bucket and a separate pass to divide took 1.19-1.46x MPI's
# bare Allreduce of 64 MB; pieces of 1, 4, 16 MiB took 0.93, 0.88, 0.87x (Open MPI's
# Allreduce is itself no slower in pieces).
CHUNK_BYTES = 4 << 20


class MpiAverager:
    """Averages CPU tensors in place with MPI Allreduce, one call at a time from a
    background thread, in the order they were handed over."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._work: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="commbench-mpi-allreduce",
                         daemon=True).start()

    def average(self, tensor):
        """A torch Future that completes with `tensor`, averaged over all ranks."""
        import torch

        future = torch.futures.Future()
        self._work.put((tensor, future))
        return future

    def ddp_hook(self, state, bucket):
        return self.average(bucket.buffer())

    def _serve(self) -> None:
        from mpi4py import MPI

        from commbench.failure import mpi_deadline

        while True:
            tensor, future = self._work.get()
            try:
                chunk = max(1, CHUNK_BYTES // tensor.element_size())
                with mpi_deadline.watch("allreduce (MPI)"):
                    for lo in range(0, tensor.numel(), chunk):
                        part = tensor[lo:lo + chunk]
                        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, part.numpy())
                        part.div_(self.world_size)  # while the chunk is still in cache
            except Exception as error:  # the waiting training step raises it
                future.set_exception(error)
            else:
                future.set_result(tensor)
