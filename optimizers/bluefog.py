"""`bluefog.*`: the decentralized strategies run by Bluefog's own optimizers
(bluefog.torch 0.3.0, MPI), on commbench's topologies, for comparison with
commbench's implementations of the same strategies.

- `bluefog.neighbor_allreduce`: DistributedAdaptWithCombineOptimizer (default) or
  DistributedAdaptThenCombineOptimizer (--atc-style) with neighbor_allreduce.
- `bluefog.hierarchical_neighbor_allreduce`: the same with Bluefog's hierarchical
  neighbor allreduce between machines (Bluefog's machines: MPI shared-memory
  groups, so at least two real machines; --machine-size cannot simulate them).
- `bluefog.gradient_allreduce`: DistributedGradientAllreduceOptimizer.

The mixing matrix is commbench's: the static W of --topology is handed to
bf.set_topology as a weighted graph; a dynamic schedule sets the optimizer's
send/receive weights before every step, exactly as Bluefog's own benchmark does
with its generators, but from commbench's schedule (whose one-peer and inner-outer
schedules follow Bluefog's generators), so both engines mix the same graphs.

Bluefog only runs under an MPI launcher (bfrun, mpirun). Its waits deadlock with
torch >= 1.10 unless they let go of the GIL: see _wait_without_the_gil.
"""

from __future__ import annotations

from typing import Any, Dict

from commbench.errors import UsageError
from commbench.optimizers.base import Strategy, TrainStep, local_step
from commbench.optimizers.decentralized import check_machine_size, checked_schedule, style

MPI_LAUNCHERS = ("openmpi", "mpich", "slurm", "single")


class _Bluefog(Strategy):
    requires = ("bluefog",)

    @classmethod
    def unusable_reason(cls):
        why = super().unusable_reason()
        return why + "; see scripts/setup_bluefog_env.sh (Python 3.9, torch 1.10)" if why else None

    @classmethod
    def check(cls, config, launch) -> None:
        if launch.launcher not in MPI_LAUNCHERS:
            raise UsageError(f"argument --dist-optimizer: {cls.name} runs only under an MPI "
                             f"launcher (bfrun, mpirun), not {launch.launcher}")
        if config.fp16_allreduce:
            raise UsageError(f"argument --fp16-allreduce: {cls.name} has no float16 "
                             "communication (Bluefog's optimizers send the parameters' dtype)")

    def _init(self):
        import bluefog.torch as bf

        _wait_without_the_gil(bf)
        bf.init()
        if (bf.rank(), bf.size()) != (self.ctx.rank, self.ctx.world_size):
            raise UsageError(f"Bluefog sees rank {bf.rank()} of {bf.size()} but the "
                             f"launcher said {self.ctx.rank} of {self.ctx.world_size}")
        return bf

    def facts(self) -> Dict[str, Any]:
        from commbench.environment import package_version

        return {"engine": "bluefog", "bluefog_version": package_version("bluefog")}


def _wait_without_the_gil(bf) -> None:
    """Make Bluefog's waits release the GIL, or its optimizers hang.

    Bluefog 0.3.0's C++ waits (synchronize/wait, win_wait, and barrier when the
    negotiation stage is skipped) spin until their handle is done while holding the
    GIL: their pybind11 bindings do not release it. Since torch 1.10 (PyObject
    preservation) Bluefog's background thread needs the GIL to drop the last
    reference of a finished op's tensor, and it does that before it runs the next op.
    So once two nonblocking ops are in flight — an optimizer issues one per
    parameter — the main thread waits for op 2 holding the GIL while the background
    thread waits for the GIL after op 1: a deadlock, no MPI call involved (seen in
    gdb on every hung rank; a build whose bindings release the GIL never hangs).

    Here the waits poll the handle from Python and sleep between polls, which
    releases the GIL; Bluefog's own wait then returns at once. Bluefog's optimizers
    look these functions up on the modules at call time, so they use them too.
    """
    import time

    import torch
    from bluefog.torch import mpi_ops

    if getattr(mpi_ops, "commbench_waits_release_the_gil", False):
        return
    lib, synchronize, win_wait = mpi_ops.mpi_lib, mpi_ops.synchronize, mpi_ops.win_wait

    def until(done, handle) -> None:
        while not done(handle):
            time.sleep(1e-4)

    def gil_free_synchronize(handle):
        if handle in mpi_ops._handle_map:
            until(lib.bluefog_torch_poll, handle)
        return synchronize(handle)

    def gil_free_win_wait(handle):
        if handle in mpi_ops._win_handle_map:
            until(lib.bluefog_torch_win_poll, handle)
        return win_wait(handle)

    def gil_free_barrier():
        gil_free_synchronize(mpi_ops.allreduce_nonblocking(torch.zeros(1),
                                                           name="commbench.barrier"))

    for module in (mpi_ops, bf):
        module.synchronize = module.wait = gil_free_synchronize
        module.win_wait = gil_free_win_wait
        module.barrier = gil_free_barrier
    mpi_ops.commbench_waits_release_the_gil = True


def _graph(weights):
    """Bluefog's graph of a commbench mixing matrix: W[i, j] is what i gives j's
    value; Bluefog's edge j -> i carries that weight (GetRecvWeights reads A[j, i])."""
    import networkx as nx

    return nx.from_numpy_array(weights.T, create_using=nx.DiGraph)


class _Decentralized(_Bluefog):
    decentralized = True
    communication = "neighbor_allreduce"

    def _nodes(self) -> int:
        return self.ctx.world_size

    def _node(self) -> int:
        return self.ctx.rank

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.schedule = checked_schedule(config.topology, self._nodes(),
                                         not config.disable_dynamic_topology,
                                         self._machine_size())

    def _machine_size(self):
        return None

    def wrap(self, model, optimizer) -> TrainStep:
        bf = self._init()
        self._set_topology(bf)
        kind = bf.CommunicationType.__members__[self.communication]
        if self.config.atc_style:
            opt = bf.DistributedAdaptThenCombineOptimizer(optimizer, model=model,
                                                          communication_type=kind)
        else:
            opt = bf.DistributedAdaptWithCombineOptimizer(optimizer, model=model,
                                                          communication_type=kind)
        train = local_step(model, opt)  # Bluefog's optimizer communicates in its step()
        if not self.schedule.dynamic:
            return train
        schedule, node, counter = self.schedule, self._node(), [0]

        def step(images, labels):
            self._set_step_weights(opt, schedule.at(counter[0]), node)
            counter[0] += 1
            return train(images, labels)

        return step

    def _set_topology(self, bf) -> None:
        static = self.schedule.at(0) if not self.schedule.dynamic else None
        from commbench.topology import build_topology

        graph = static if static is not None else build_topology(self.config.topology,
                                                                 self._nodes())
        if not bf.set_topology(_graph(graph.weights), is_weighted=True):
            raise UsageError(f"Bluefog refused topology {self.config.topology!r}")

    def _set_step_weights(self, opt, topology, node) -> None:
        """This step's graph, as Bluefog's benchmark sets it from its generators."""
        opt.self_weight = topology.self_weight(node)
        opt.src_weights = dict(topology.in_neighbors(node))
        opt.dst_weights = {d: 1.0 for d in topology.out_neighbors(node)}
        opt.enable_topo_check = False

    def facts(self) -> Dict[str, Any]:
        return {**super().facts(), "topology": self.config.topology,
                "dynamic": self.schedule.dynamic, "schedule": self.schedule.kind,
                "schedule_period": self.schedule.period, "style": style(self.config.atc_style)}


class BluefogNeighborAllreduce(_Decentralized):
    name = "bluefog.neighbor_allreduce"
    summary = ("Bluefog's own AWC/ATC optimizer with neighbor_allreduce (W of --topology, "
               "static or dynamic); MPI launchers only")

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        check_machine_size(config.machine_size, launch.world_size)
        checked_schedule(config.topology, launch.world_size,
                         not config.disable_dynamic_topology)

    def _machine_size(self):
        equal = self.ctx.machine_size > 0
        return self.ctx.machine_size if equal and self.ctx.num_machines > 1 else None


class BluefogHierarchicalNeighborAllreduce(_Decentralized):
    name = "bluefog.hierarchical_neighbor_allreduce"
    summary = ("Bluefog's own optimizer with hierarchical neighbor allreduce (machines are "
               "super-nodes); needs >= 2 real machines")
    communication = "hierarchical_neighbor_allreduce"

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        if config.machine_size is not None:
            raise UsageError(f"argument --machine-size: {cls.name} takes its machines from "
                             "MPI (shared-memory groups); they cannot be simulated")

    def __init__(self, ctx, config):
        if ctx.machine_size == 0 or ctx.num_machines < 2:
            raise UsageError(f"{self.name} needs at least 2 machines with the same number "
                             f"of ranks; this job has {ctx.num_machines}")
        super().__init__(ctx, config)

    def _nodes(self) -> int:
        return self.ctx.num_machines

    def _node(self) -> int:
        return self.ctx.machine

    def _set_topology(self, bf) -> None:
        from commbench.topology import build_topology

        graph = build_topology(self.config.topology, self._nodes())
        if not bf.set_machine_topology(_graph(graph.weights), is_weighted=True):
            raise UsageError(f"Bluefog refused machine topology {self.config.topology!r}")

    def _set_step_weights(self, opt, topology, node) -> None:
        opt.self_weight = topology.self_weight(node)
        opt.neighbor_machine_weights = dict(topology.in_neighbors(node))
        opt.send_neighbor_machines = list(topology.out_neighbors(node))
        opt.enable_topo_check = False


class BluefogGradientAllreduce(_Bluefog):
    name = "bluefog.gradient_allreduce"
    summary = "Bluefog's own DistributedGradientAllreduceOptimizer; MPI launchers only"

    def wrap(self, model, optimizer) -> TrainStep:
        bf = self._init()
        bf.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = bf.DistributedGradientAllreduceOptimizer(optimizer, model=model)
        return local_step(model, opt)
