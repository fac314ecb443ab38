"""`neighbor_allreduce`: each worker averages its parameters with its in-neighbors'
(mixing matrix W of --topology) and takes its local gradient step, as Bluefog's
DistributedAdaptWithCombineOptimizer (default) and ...AdaptThenCombineOptimizer
(--atc-style) do.

Topology per step, as Bluefog's benchmark chooses it: the dynamic one-peer schedule
over --topology by default (each worker sends to one out-neighbor per step); on
several equal machines with exponential-2, Bluefog's inner-outer schedule; the
static graph every step with --disable-dynamic-topology.

--compression fp16|bf16 sends the parameters in the narrow type; each worker combines
what it receives into its own full-precision copy, never rounded itself.
"""

from __future__ import annotations

from typing import Any, Dict

from commbench.config import compression
from commbench.comm.neighbor_exchange import CHUNK_BYTES
from commbench.comm.transport import (check_cpu_transport, choose_transport,
                                      small_message_facts, small_messages,
                                      transport_for, transport_reason)
from commbench.errors import UsageError
from commbench.launch.gpus import torch_older_than
from commbench.optimizers.mixing import MixingStrategy


class NeighborAllreduce(MixingStrategy):
    name = "neighbor_allreduce"
    summary = ("average parameters with in-neighbors (W of --topology) around the local "
               "step; AWC or --atc-style; dynamic one-peer schedule by default")
    compressions = ("fp16", "bf16")

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        check_cpu_transport(config.cpu_transport, launch)

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.codec = compression.of(config)
        self.transport = choose_transport(config.cpu_transport, ctx)
        self.small_messages = small_messages(config.cpu_transport, ctx, point_to_point=True)
        self.gossip = None  # --recovery gossip: the survivors' side (gossip_recovery)
        if config.recovery == "gossip":
            from commbench.faults.gossip_recovery import Gossip

            self.gossip = Gossip(ctx, config)
        if self.transport == "nccl" and torch_older_than(1, 12):
            # Batched point-to-point with more than 2 ranks hangs NCCL before torch 1.12
            # (pytorch/pytorch#73960); every rank stops here alike.
            raise UsageError(f"{self.name} on GPUs needs torch >= 1.12 (its NCCL "
                             "point-to-point batches hang before); pass --no-cuda or "
                             "upgrade torch")

    def own_recovery(self):
        return self.gossip

    def build_mixer(self, buffers):
        from commbench.comm.neighbor_exchange import NeighborExchange

        if self.gossip is not None:
            from commbench.faults.gossip_exchange import SurvivingExchange

            return SurvivingExchange(buffers, self.schedule, self.ctx.rank, self.gossip,
                                     narrow=self.codec.wire_dtype())
        return NeighborExchange(buffers, self.schedule, self.ctx.rank,
                                narrow=self.codec.wire_dtype(),
                                transport=self.transport_for(buffers))

    def settle(self) -> None:
        if self.gossip is not None:  # a lost rank would fail the collectives that follow
            self.mixer.gather()

    def transport_for(self, buffers) -> str:
        """The transport of an exchange of `buffers`: latency binds a small model's. The
        bytes counted are those sent (narrow copies with --compression fp16 or bf16)."""
        nbytes = sum(b.numel() * (2 if self.codec.on else b.element_size()) for b in buffers)
        return transport_for(nbytes, self.transport, self.small_messages)

    def facts(self) -> Dict[str, Any]:
        """Besides the topology settings: precision, transport, how fast W mixes, and
        the machines."""
        from commbench.topology import build_topology

        ctx = self.ctx
        size, machines = self.gossip.machines() if self.gossip else (ctx.machine_size,
                                                                     ctx.num_machines)
        return {
            **super().facts(),
            "fp16": self.codec.kind == "fp16",
            "compression": str(self.codec),
            "transport": self.transport,
            "transport_reason": transport_reason(self.config.cpu_transport, self.transport, ctx),
            **small_message_facts(self.small_messages),
            "message_bytes": CHUNK_BYTES[self.transport],  # None: one per buffer and peer
            # the nodes as the job started (gossip's survivors renumber the context)
            "spectral_gap": build_topology(self.config.topology,
                                           self.schedule.size).spectral_gap,
            "machine_size": size,  # as the job started
            "num_machines": machines,
            "simulated_machines": ctx.simulated_machines,
        }
