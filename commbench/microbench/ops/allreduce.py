"""microbench op `allreduce`: one flat bucket of S bytes averaged as the plugin's DDP
comm hook does (divide by n, then all_reduce: torch.distributed's, or MPI's on CPU
under an MPI launcher, per --cpu-transport; with --compression fp16|bf16 torch's
compression hook: cast, divide, all_reduce, cast back). Not DDP itself: its reducer
needs a model and a backward pass, and would time those too.

Raw rows: torch `all_reduce` of the float32 tensor (a sum, nothing else); mpi4py
`Allreduce` in place (only under an MPI launcher); with --compression, torch
`all_reduce` of a tensor already in the narrow type (the collective without the
casts: what the codec costs is the commbench row's time over it).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from commbench.result import metrics
from commbench.microbench.ops.base import Data, Op, Primitive, on_mpi_cpu


class Allreduce(Op):
    name = "allreduce"

    def __init__(self, plugin_cls, ctx, config, data: Data):
        super().__init__(plugin_cls, ctx, config, data)
        self.buffer = data.fresh()
        self.plugin = plugin_cls(ctx, config)
        from commbench.config import compression

        compression.refuse_unsummable(self.codec, ctx.device, ctx.backend, "--compression")

    def run(self) -> None:  # the plugin's comm hook on one bucket: divide, then sum
        self.plugin.average(self.buffer)

    def transport(self) -> Optional[str]:
        """The allreduce strategy's transport for this bucket; None for a plugin that
        decides on its own (Horovod)."""
        transport_of = getattr(self.plugin, "transport_of", None)
        return transport_of(self.buffer) if transport_of else None

    def traffic(self, call: int) -> Tuple[float, float]:
        ring = metrics.ring_allreduce_bytes(self.S, self.n)
        return ring, ring

    def reference(self, call: int) -> List[float]:
        return [1.0 / self.n] * self.n

    def bandwidths(self, algbw: float) -> Dict[str, float]:
        return {"busbw": algbw * metrics.allreduce_bus_factor(self.n)}

    def raw(self) -> List[Primitive]:
        import torch.distributed as dist

        summed = self.data.fresh()
        found = [Primitive("torch all_reduce", lambda: dist.all_reduce(summed),
                           self.data.copy_in(summed))]
        if self.codec.kind != "none":
            narrow = self.data.fresh().to(self.codec.wire_dtype())
            found.append(Primitive(f"torch all_reduce {self.codec}",
                                   lambda: dist.all_reduce(narrow), self.data.copy_in(narrow),
                                   self.wire_fraction))
        if on_mpi_cpu(self.ctx):
            from mpi4py import MPI

            flat = self.data.fresh()
            view = flat.numpy()  # zero copy: MPI reads and writes the tensor's memory
            comm = MPI.COMM_WORLD
            found.append(Primitive("MPI Allreduce",
                                   lambda: comm.Allreduce(MPI.IN_PLACE, view),
                                   self.data.copy_in(flat)))
        return found
