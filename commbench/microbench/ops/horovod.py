"""microbench op `horovod`: one flat bucket averaged by Horovod (`hvd.allreduce_`,
op Average), the call the `horovod` plugin's DistributedOptimizer makes for each
gradient: through Horovod's background thread, its negotiation of every tensor, its
fusion buffer and its cycle; with --compression fp16, `hvd.allreduce` with Horovod's
own `Compression.fp16`, copied back. Its raw rows are the `allreduce` op's (torch all_reduce;
mpi4py Allreduce under an MPI launcher), so Horovod is set against the bare collectives
moving the same bytes. Needs the launch the plugin needs (horovodrun or mpirun).
"""

from __future__ import annotations

from commbench.errors import UsageError
from commbench.microbench.ops.allreduce import Allreduce


class Horovod(Allreduce):
    name = "horovod"

    def __init__(self, plugin_cls, ctx, config, data):
        super().__init__(plugin_cls, ctx, config, data)
        import horovod.torch as hvd

        hvd.init()
        if ctx.device.type == "cuda" and not hvd.nccl_built():
            raise UsageError("argument --op: this Horovod was built without GPU operations "
                             "and would move CUDA tensors through host memory; pass --no-cuda")
        self.hvd = hvd
        # One name per size: Horovod caches each named tensor's negotiation by its shape.
        self.tensor_name = f"microbench.horovod.{data.count}"

    def run(self) -> None:
        hvd = self.hvd
        if self.codec.kind == "fp16":
            self.buffer.copy_(hvd.allreduce(self.buffer, op=hvd.Average, name=self.tensor_name,
                                            compression=hvd.Compression.fp16))
        else:
            hvd.allreduce_(self.buffer, op=hvd.Average, name=self.tensor_name)
