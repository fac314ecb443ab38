"""`horovod`: average gradients through Horovod's own DistributedOptimizer (its
background thread fuses tensors into buffers and allreduces them during backward),
then a local SGD step; the same mathematics as `allreduce`, Horovod's machinery.

Options, as Horovod's synthetic benchmark names them: --fp16-allreduce
(hvd.Compression.fp16), --use-adasum (op=hvd.Adasum instead of averaging) and
--hierarchical-allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE=1: allreduce inside each
machine, then across machines). Runs under horovodrun (gloo or MPI controller) and
under mpirun/mpiexec (MPI controller); Horovod reads its settings at hvd.init().

Bytes on the wire: each gradient is recorded as Horovod's compression hands it over
(in the type it travels in), with what the allreduce that carries it sends: Open MPI's
for large messages (recursive halving and doubling) on the CPU under the MPI
controller, else a ring (gloo's, NCCL's). Horovod fuses the tensors into messages of its
own, which commbench does not see (no message count). Adasum, and NCCL's hierarchical
allreduce on GPUs, are neither: their bytes are not recorded.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

from commbench.config import compression
from commbench.timing import spans, trace_file, wire
from commbench.errors import UsageError
from commbench.config.flags import flag
from commbench.launch.detect import MPI_WORLDS
from commbench.optimizers.base import Strategy, TrainStep
from commbench.job.training_step import TrainingStep

# Launchers under which hvd.init() finds its peers (torchrun gives Horovod nothing to use).
LAUNCHERS = ("horovodrun",) + MPI_WORLDS


@dataclass(frozen=True)
class HorovodOptions:
    use_adasum: bool = flag(False, "combine gradients with Adasum instead of "
                            "averaging them")
    hierarchical_allreduce: bool = flag(False, "hierarchical allreduce (inside "
                                        "each machine, then across machines)")


class Horovod(Strategy):
    name = "horovod"
    summary = ("average gradients with Horovod's DistributedOptimizer (tensor fusion, "
               "overlapped with backward); --fp16-allreduce, --use-adasum, "
               "--hierarchical-allreduce")
    requires = ("horovod",)
    compressions = ("fp16",)  # Horovod's own Compression.fp16
    Options = HorovodOptions
    counts_messages = False  # Horovod's fusion buffer decides them

    @classmethod
    def unusable_reason(cls) -> Optional[str]:
        why = super().unusable_reason()
        if why is None and importlib.util.find_spec("horovod.torch") is None:
            why = "horovod is installed without PyTorch support (HOROVOD_WITH_PYTORCH=1)"
        if why:
            why += "; see scripts/install_horovod.sh"
        return why

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        if launch.launcher not in LAUNCHERS:
            raise UsageError(f"argument --dist-optimizer: horovod cannot run under "
                             f"{launch.launcher}; start it with horovodrun or mpirun")
        # Set here, before any hvd.init(): under horovodrun's gloo controller the
        # rendezvous (launch.distributed) initialises Horovod before wrap() runs.
        if cls.options_of(config).hierarchical_allreduce:
            os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
        if config.timeline is not None and "HOROVOD_TIMELINE" not in os.environ:
            # Horovod's own timeline (per tensor: negotiation, queue, fused allreduce)
            # beside commbench's; one given to horovodrun (--timeline-filename) stays.
            path = trace_file.beside(config.timeline, "horovod")
            if os.path.exists(path):
                raise UsageError(f"argument --timeline: {path} (Horovod's own timeline) "
                                 "exists; commbench never overwrites a measurement")
            os.environ["HOROVOD_TIMELINE"] = path

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self._facts: Dict[str, Any] = {}

    def wrap(self, model, optimizer) -> TrainStep:
        import horovod
        import horovod.torch as hvd

        hvd.init()
        if (hvd.rank(), hvd.size()) != (self.ctx.rank, self.ctx.world_size):
            raise UsageError(f"Horovod sees rank {hvd.rank()} of {hvd.size()} but the "
                             f"launcher said {self.ctx.rank} of {self.ctx.world_size}")
        if self.ctx.device.type == "cuda" and not hvd.nccl_built():
            raise UsageError("argument --dist-optimizer: this Horovod was built without GPU "
                             "operations and would move CUDA tensors through host memory: "
                             "rebuild it on a machine with a GPU (scripts/install_horovod.sh "
                             "sets HOROVOD_GPU_OPERATIONS=NCCL there), or pass --no-cuda")
        if self.options.use_adasum and not hvd.mpi_enabled():
            raise UsageError("argument --use-adasum: Horovod's Adasum needs the MPI "
                             "controller (horovodrun --mpi, or mpirun)")
        fp16 = compression.of(self.config).kind == "fp16"
        codec = hvd.Compression.fp16 if fp16 else hvd.Compression.none
        op = hvd.Adasum if self.options.use_adasum else hvd.Average
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer,
                                             named_parameters=model.named_parameters(),
                                             compression=Handed(codec, self.wire_of(hvd)),
                                             op=op)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        self._facts = {
            "horovod_version": horovod.__version__,
            "controller": "mpi" if hvd.mpi_enabled() else "gloo",
            "cpu_operations": "mpi" if hvd.mpi_enabled() else "gloo",
            "cuda_built": bool(hvd.cuda_built()),
            "nccl_built": bool(hvd.nccl_built()),
            "compression": "fp16" if fp16 else "none",
            "op": "adasum" if self.options.use_adasum else "average",
            # Horovod implements the hierarchical switch for NCCL (GPU) allreduce; CPU
            # operations accept it and run their flat allreduce.
            "hierarchical_allreduce": self.options.hierarchical_allreduce,
            "engine_timeline": os.environ.get("HOROVOD_TIMELINE"),
        }
        if self.options.use_adasum:  # Horovod's Adasum refuses a step without its sync
            return TrainingStep(model, optimizer)

        # Horovod's step() waits for its allreduces first; waiting for them apart
        # (its documented synchronize/skip_synchronize) puts that wait on the record.
        def update():
            with optimizer.skip_synchronize():
                optimizer.step()

        return TrainingStep(model, optimizer, before_update=lambda at: optimizer.synchronize(),
                            update=update)

    def wire_of(self, hvd):
        """What an allreduce of n bytes puts on the wire from this rank."""
        ranks, rank = self.ctx.world_size, self.ctx.rank
        if hvd.mpi_enabled() and self.ctx.device.type == "cpu":
            return lambda n: wire.halving_doubling_allreduce(n, ranks, rank)
        return lambda n: wire.ring_allreduce(n, ranks)

    @property
    def sees_wire(self) -> bool:
        hierarchical_nccl = self.options.hierarchical_allreduce and \
            self.ctx.device.type == "cuda"
        return not (self.options.use_adasum or hierarchical_nccl)

    def facts(self) -> Dict[str, Any]:
        return dict(self._facts)


class Handed:
    """Horovod's compression (its Compressor interface), recording each tensor as it
    hands it to Horovod: its bytes as they travel, and what sent_by(bytes) says their
    allreduce puts on the wire."""

    def __init__(self, codec, sent_by):
        self.codec, self.sent_by = codec, sent_by

    def compress(self, tensor):
        compressed, context = self.codec.compress(tensor)
        if spans.recording():
            nbytes = compressed.numel() * compressed.element_size()
            at = spans.now()
            spans.record("handed", at, at, "handed to Horovod", nbytes,
                         sent=wire.Sent(self.sent_by(nbytes).nbytes, 0))
        return compressed, context

    def decompress(self, tensor, context):
        return self.codec.decompress(tensor, context)
