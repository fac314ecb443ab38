"""Averaging CPU tensors in place with MPI's Allreduce (mpi4py, on the tensors' own
memory), for DDP's buckets: installed as DDP's comm hook, DDP and its buckets stay and
only the wire changes.

One background thread issues the Allreduces in the order they were handed over (DDP's
bucket order, the same on every rank), so backward goes on computing meanwhile, as it
does beside gloo's own thread. MPI has no float16 sum: --fp16-allreduce stays on gloo.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

# Each tensor is summed and divided in pieces of this size: dividing a piece right
# after its Allreduce, while it is still in cache, saves a separate pass over the
# whole tensor, and Open MPI's Allreduce is no slower in pieces of this size.
CHUNK_BYTES = 4 << 20


class MpiAverager:
    """Averages CPU tensors in place over all ranks, one call at a time, from a
    background thread."""

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

        from commbench.job.failure import mpi_deadline

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
