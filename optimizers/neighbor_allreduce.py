"""`neighbor_allreduce`: each worker averages its parameters with its in-neighbors'
(mixing matrix W of --topology) and takes its local gradient step, as Bluefog's
DistributedAdaptWithCombineOptimizer (default) and ...AdaptThenCombineOptimizer
(--atc-style) do.

Topology per step, as Bluefog's benchmark chooses it: the dynamic one-peer schedule
over --topology by default (each worker sends to one out-neighbor per step); on
several equal machines with exponential-2, Bluefog's inner-outer schedule; the
static graph every step with --disable-dynamic-topology.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from commbench.optimizers.base import Strategy, TrainStep
from commbench.optimizers.decentralized import (check_cpu_transport, check_machine_size,
                                                checked_schedule, combine_step, mixing_facts)
from commbench.optimizers.neighbor_exchange import choose_transport


class NeighborAllreduce(Strategy):
    name = "neighbor_allreduce"
    summary = ("average parameters with in-neighbors (W of --topology) around the local "
               "step; AWC or --atc-style; dynamic one-peer schedule by default")
    decentralized = True

    @classmethod
    def check(cls, config, launch) -> None:
        check_machine_size(config.machine_size, launch.world_size)
        check_cpu_transport(config.cpu_transport, launch)
        # Machines are not known yet; every error of the topology itself shows here.
        checked_schedule(config.topology, launch.world_size,
                         not config.disable_dynamic_topology)

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.schedule = checked_schedule(config.topology, ctx.world_size,
                                         not config.disable_dynamic_topology,
                                         self._machine_size())
        self.transport = choose_transport(config.cpu_transport, ctx)
        self.mixer = None  # a NeighborExchange over the model's flat buffers, after wrap

    def _machine_size(self) -> Optional[int]:
        """Ranks per machine when there are several equal machines (real or simulated):
        Bluefog's benchmark then uses its multi-machine schedule."""
        equal = self.ctx.machine_size > 0
        return self.ctx.machine_size if equal and self.ctx.num_machines > 1 else None

    def wrap(self, model, optimizer) -> TrainStep:
        from commbench.optimizers.fused import fuse_parameters
        from commbench.optimizers.neighbor_exchange import NeighborExchange

        self.mixer = NeighborExchange(fuse_parameters(model), self.schedule, self.ctx.rank,
                                      fp16=self.config.fp16_allreduce,
                                      transport=self.transport)
        return combine_step(model, optimizer, self.mixer, self.config.atc_style)

    def facts(self) -> Dict[str, Any]:
        return mixing_facts(self.config, self.ctx, self.schedule, self.ctx.world_size,
                            self.transport)
