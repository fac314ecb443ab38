"""`hierarchical_neighbor_allreduce`: machines act as super-nodes. Parameters are
averaged inside each machine (allreduce), the first rank of each machine averages
the result with its neighbor machines' (W_M: --topology over machines, static with
--disable-dynamic-topology, else its one-peer schedule, which for the default
exponential-2 is Bluefog's GetExp2DynamicSendRecvMachineRanks), and broadcasts it
back inside its machine. One step: X' = (W_M kron J_L/L) X.

Machines are the launcher's, or simulated with --machine-size N; they must all hold
the same number of ranks. AWC (default) or ATC (--atc-style), as neighbor_allreduce.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from commbench.errors import UsageError
from commbench.optimizers.base import Strategy, TrainStep
from commbench.optimizers.decentralized import (check_cpu_transport, check_machine_size,
                                                checked_schedule, combine_step, mixing_facts)
from commbench.optimizers.neighbor_exchange import choose_transport


class HierarchicalNeighborAllreduce(Strategy):
    name = "hierarchical_neighbor_allreduce"
    summary = ("allreduce inside each machine, neighbor averaging between machines "
               "(one rank per machine talks), broadcast back; AWC or --atc-style")
    decentralized = True

    @classmethod
    def check(cls, config, launch) -> None:
        check_machine_size(config.machine_size, launch.world_size)
        check_cpu_transport(config.cpu_transport, launch)
        machine_size = config.machine_size or launch.local_size
        machines = launch.world_size // machine_size if machine_size else 1
        # Real machines are known only after rendezvous (see __init__); every error of
        # the topology itself shows here already, whatever the number of machines.
        checked_schedule(config.topology, machines, not config.disable_dynamic_topology)
        if launch.world_size > 1 and machine_size == launch.world_size:
            # One machine would make this a plain allreduce under another name.
            raise UsageError(f"argument --machine-size: {cls.name} needs at least 2 machines, "
                             f"but all {launch.world_size} ranks are on one; pass "
                             f"--machine-size N to simulate machines of N ranks")

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        if ctx.machine_size == 0:
            # Every rank sees the same hostnames, so every rank stops here alike.
            raise UsageError(f"{self.name} needs the same number of ranks on every machine; "
                             f"these {ctx.num_machines} machines differ: pass --machine-size N "
                             f"to simulate equal machines")
        self.schedule = checked_schedule(config.topology, ctx.num_machines,
                                         not config.disable_dynamic_topology)
        # The leaders' exchange between machines; inside a machine, torch.distributed.
        self.transport = choose_transport(config.cpu_transport, ctx)
        self.mixer = None  # a MachineAveraging over the model's flat buffers, after wrap

    def wrap(self, model, optimizer) -> TrainStep:
        from commbench.optimizers.fused import fuse_parameters
        from commbench.optimizers.neighbor_exchange import NeighborExchange

        buffers = fuse_parameters(model)
        if self.ctx.machine_size == 1:  # machines of one rank: plain neighbor averaging
            self.mixer = NeighborExchange(buffers, self.schedule, self.ctx.rank,
                                          fp16=self.config.fp16_allreduce,
                                          transport=self.transport)
        else:
            self.mixer = MachineAveraging(buffers, self.schedule, self.ctx.rank,
                                          self.ctx.machine_size, self.config.fp16_allreduce,
                                          overlapped=not self.config.atc_style,
                                          transport=self.transport)
        return combine_step(model, optimizer, self.mixer, self.config.atc_style)

    def facts(self) -> Dict[str, Any]:
        return mixing_facts(self.config, self.ctx, self.schedule, self.ctx.num_machines,
                            self.transport)


class MachineAveraging:
    """The mixer of one hierarchical step over flat parameter buffers x (machines of
    two or more ranks).

    The machine's sum travels in communication buffers c: x itself when nothing
    reads x meanwhile (ATC in float32), else a copy (AWC: backward still reads x
    while the allreduce runs; --fp16-allreduce: c holds float16). Only the leader
    (first rank of a machine) talks to other machines, through a NeighborExchange
    whose nodes are machines (over `transport`); its step counter follows the machine
    schedule.
    """

    def __init__(self, buffers, schedule, rank: int, machine_size: int, fp16: bool,
                 overlapped: bool, transport: str = "gloo"):
        import torch
        import torch.distributed as dist

        from commbench.optimizers.neighbor_exchange import NeighborExchange

        self.buffers = list(buffers)
        self.local = machine_size
        machines, machine = schedule.size, rank // machine_size
        self.leader = machine * machine_size
        self.fp16 = fp16
        if fp16:
            self.comm = [torch.empty_like(b, dtype=torch.float16) for b in self.buffers]
        elif overlapped:
            self.comm = [torch.empty_like(b) for b in self.buffers]
        else:
            self.comm = self.buffers
        # new_group must be called by every rank for every group, in the same order.
        groups = [dist.new_group(list(range(m * machine_size, (m + 1) * machine_size)))
                  for m in range(machines)]
        self.group = groups[machine]
        self.several_machines = machines > 1
        self.exchange: Optional[NeighborExchange] = None
        if rank == self.leader and self.several_machines:
            # With fp16 the leader combines in x (full precision) and sends float16
            # copies; otherwise it combines the machine average in c, without copies.
            self.exchange = NeighborExchange(self.buffers if fp16 else self.comm, schedule,
                                             machine, [m * machine_size for m in range(machines)],
                                             fp16=fp16, transport=transport)
        self._works: List = []

    def start(self) -> None:
        import torch.distributed as dist

        for c, x in zip(self.comm, self.buffers):
            if c is not x:
                c.copy_(x)
        self._works = [dist.all_reduce(c, group=self.group, async_op=True) for c in self.comm]

    def finish(self) -> None:
        import torch.distributed as dist

        for work in self._works:
            work.wait()
        self._works = []
        if not self.several_machines:  # every rank holds the sum: average locally
            for c, x in zip(self.comm, self.buffers):
                if c is not x:
                    x.copy_(c)
                x.div_(self.local)
            return
        if self.exchange is not None:
            self._combine_with_other_machines()
        # Non-leaders' c holds the machine sum; the leader's result overwrites it.
        for work in [dist.broadcast(c, self.leader, group=self.group, async_op=True)
                     for c in self.comm]:
            work.wait()
        for c, x in zip(self.comm, self.buffers):
            if c is not x:
                x.copy_(c)  # the leader too: every rank of a machine ends identical

    def _combine_with_other_machines(self) -> None:
        if not self.fp16:
            for c in self.comm:
                c.div_(self.local)
            self.exchange()
        else:  # fp16: average and combine in x, then round into c for the broadcast
            for c, x in zip(self.comm, self.buffers):
                x.copy_(c).div_(self.local)
            self.exchange()
            for c, x in zip(self.comm, self.buffers):
                c.copy_(x)
