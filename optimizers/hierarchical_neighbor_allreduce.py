"""`hierarchical_neighbor_allreduce`: machines act as super-nodes. Parameters are
averaged inside each machine (allreduce), the first rank of each machine averages
the result with its neighbor machines' (W_M: --topology over machines, static with
--disable-dynamic-topology, else its one-peer schedule, which for the default
exponential-2 is Bluefog's GetExp2DynamicSendRecvMachineRanks), and broadcasts it
back inside its machine. One step: X' = (W_M kron J_L/L) X.

Machines are the launcher's, or simulated with --machine-size N; they must all hold
the same number of ranks. AWC (default) or ATC (--atc-style), as neighbor_allreduce.
Under --recovery gossip the survivors' step is commbench.faults.gossip_machines'.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from commbench.config import compression
from commbench.comm.transport import SMALL_MESSAGE_BYTES
from commbench.errors import UsageError
from commbench.optimizers.neighbor_allreduce import NeighborAllreduce


class HierarchicalNeighborAllreduce(NeighborAllreduce):
    """neighbor_allreduce whose nodes are machines; its checks, transport and facts."""

    name = "hierarchical_neighbor_allreduce"
    summary = ("allreduce inside each machine, neighbor averaging between machines "
               "(one rank per machine talks), broadcast back; AWC or --atc-style")

    @classmethod
    def nodes_before_init(cls, config, launch) -> int:
        machine_size = config.machine_size or launch.local_size
        return launch.world_size // machine_size if machine_size else 1

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        machine_size = config.machine_size or launch.local_size
        if launch.world_size > 1 and machine_size == launch.world_size:
            # One machine would make this a plain allreduce under another name.
            raise UsageError(f"argument --machine-size: {cls.name} needs at least 2 machines, "
                             f"but all {launch.world_size} ranks are on one; pass "
                             f"--machine-size N to simulate machines of N ranks")

    def __init__(self, ctx, config):
        if ctx.machine_size == 0:
            # Every rank sees the same hostnames, so every rank stops here alike.
            raise UsageError(f"{self.name} needs the same number of ranks on every machine; "
                             f"these {ctx.num_machines} machines differ: pass --machine-size N "
                             f"to simulate equal machines")
        # The transport carries the leaders' exchange between machines; inside a
        # machine, shared memory where `auto` moves it over gloo, else torch.distributed.
        super().__init__(ctx, config)

    def nodes(self) -> int:
        return self.ctx.num_machines

    def node(self) -> int:
        return self.ctx.machine

    def schedule_machine_size(self) -> Optional[int]:
        return None  # the nodes are machines already

    def build_mixer(self, buffers):
        from commbench.comm.machine_averaging import MachineAveraging

        if self.ctx.machine_size == 1:  # machines of one rank: plain neighbor averaging
            return super().build_mixer(buffers)
        if self.gossip is not None:  # survivors go on around a lost rank
            from commbench.faults.gossip_machines import SurvivingMachines

            return SurvivingMachines(buffers, self.schedule, self.ctx.machine_size, self.gossip)
        transport = self.transport_for(buffers)
        nbytes = sum(b.numel() * b.element_size() for b in buffers)
        inside = self.inside_machines(transport, nbytes)
        # The machine's process group sums in the narrow type (shared memory too falls
        # back to it where a machine cannot make its slots).
        compression.refuse_unsummable(self.codec, buffers[0].device, self.ctx.backend,
                                      "--compression")
        return MachineAveraging(buffers, self.schedule, self.ctx.rank, self.ctx.machine_size,
                                self.codec.wire_dtype(),
                                overlapped=not self.config.atc_style, transport=transport,
                                inside=inside)

    # Below this many bytes of buffers a step is a few small messages, which latency
    # binds: the shared slots' extra signals would cost more than the copies they save.
    shared_memory_bytes = SMALL_MESSAGE_BYTES

    def inside_machines(self, transport: str, nbytes: int) -> Optional[str]:
        """What `auto` asks to carry the bytes inside a machine: shared memory where the
        leaders' exchange of large buffers goes over gloo (on one machine MPI has them
        already; on GPUs NCCL); None: the machine's process group."""
        from commbench.comm.machine_averaging import SHARED_MEMORY

        auto = self.config.cpu_transport == "auto"
        large = nbytes >= self.shared_memory_bytes
        return SHARED_MEMORY if auto and transport == "gloo" and large else None

    def facts(self) -> Dict[str, Any]:
        """Besides neighbor_allreduce's: what carried the bytes inside each machine
        (the machine's process group when the shared slots could not be made)."""
        inside = getattr(getattr(self, "mixer", None), "inside", None)
        if inside is None and self.ctx.machine_size > 1:  # before the mixer is built
            inside = self.ctx.backend
            if self.inside_machines(self.transport, self.shared_memory_bytes):
                inside = (f"shared memory (buffers of {self.shared_memory_bytes >> 10} KB "
                          f"or more; else {inside})")
        return {**super().facts(), "machine_transport": inside}
