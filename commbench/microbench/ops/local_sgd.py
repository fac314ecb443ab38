"""microbench op `local_sgd`: the periodic strategies' meeting, one flat model of S
bytes averaged over all ranks as `local_sgd` averages its model every H-th step
(torch's model_averaging helper: flatten, divide, all_reduce over torch.distributed's
backend, copy back). `diloco` sends its pseudo-gradient in the same call. Give the
model's size as -b and -e to time one meeting of that model; between meetings these
strategies send nothing. The meeting is float32: --compression is refused.

Raw rows as `allreduce`'s: torch `all_reduce` of the float32 tensor, and mpi4py
`Allreduce` under an MPI launcher, so ours/this shows what the helper's copies cost
and whether MPI would carry the meeting faster.
"""

from __future__ import annotations

from typing import Optional

from commbench.microbench.ops.allreduce import Allreduce
from commbench.microbench.ops.base import Data, Op


class LocalSgd(Allreduce):
    name = "local_sgd"
    compresses = False

    def __init__(self, plugin_cls, ctx, config, data: Data):
        Op.__init__(self, plugin_cls, ctx, config, data)
        from commbench.optimizers import local_sgd

        self.average = local_sgd.average
        self.buffer = data.fresh()

    def run(self) -> None:  # one meeting, as the strategy's after-update runs it
        self.average([self.buffer])

    def transport(self) -> Optional[str]:
        return self.ctx.backend
