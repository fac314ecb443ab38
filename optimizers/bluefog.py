"""`bluefog.*`: the decentralized strategies run by Bluefog's own optimizers
(bluefog.torch 0.3.0, MPI), on commbench's topologies, for comparison with
commbench's implementations of the same strategies.

- `bluefog.neighbor_allreduce`: DistributedAdaptWithCombineOptimizer (default) or
  DistributedAdaptThenCombineOptimizer (--atc-style) with neighbor_allreduce.
- `bluefog.hierarchical_neighbor_allreduce`: the same with Bluefog's hierarchical
  neighbor allreduce between machines (Bluefog's machines: MPI shared-memory
  groups, so at least two real machines; --machine-size cannot simulate them).
- `bluefog.gradient_allreduce`: DistributedGradientAllreduceOptimizer.
- `bluefog.win_put`: DistributedWinPutOptimizer, Bluefog's one-sided averaging: after
  its forward pass each worker puts its parameters into its out-neighbors' MPI windows
  without waiting for them, and before its update averages its own parameters with
  whatever its window holds (the static W of --topology); a dynamic schedule puts to
  this step's out-neighbors only, as Bluefog's own benchmark does.

The mixing matrix is commbench's: the static W of --topology is handed to
bf.set_topology as a weighted graph; a dynamic schedule sets the optimizer's
send/receive weights before every step, exactly as Bluefog's own benchmark does
with its generators, but from commbench's schedule (whose one-peer and inner-outer
schedules follow Bluefog's generators), so both engines mix the same graphs.

Bluefog only runs under an MPI launcher (bfrun, mpirun). Its waits deadlock with
torch >= 1.10 unless they let go of the GIL: see commbench.optimizers.bluefog_fixes, and
docs/engines.md for how that was found.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any, Dict

from commbench.timing import trace_file
from commbench.errors import UsageError
from commbench.launch.detect import MPI_WORLDS
from commbench.optimizers.base import Strategy, TrainStep
from commbench.optimizers.mixing import MixingStrategy
from commbench.optimizers.bluefog_fixes import (HIERARCHICAL_UNFIXED,
                                                hierarchical_as_fixed_upstream,
                                                wait_without_the_gil)
from commbench.job.training_step import TrainingStep


class _Bluefog(Strategy):
    requires = ("bluefog",)
    records_split = False  # Bluefog communicates inside its optimizer's step

    @classmethod
    def unusable_reason(cls):
        why = super().unusable_reason()
        return why + "; see scripts/setup_bluefog_env.sh (Python 3.9, torch 1.10)" if why else None

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        if launch.launcher not in MPI_WORLDS:
            raise UsageError(f"argument --dist-optimizer: {cls.name} runs only under an MPI "
                             f"launcher (bfrun, mpirun), not {launch.launcher}")
        if config.language_model is not None and importlib.util.find_spec("transformers") is None:
            # Bluefog builds only against torch 1.10; the transformers releases that define
            # the language models are made for newer torch, so its environment has none.
            raise UsageError(f"argument --model: {cls.name} cannot train {config.model}: "
                             "Bluefog's environment (torch 1.10) has no transformers, which "
                             "defines the language models; commbench's own "
                             "neighbor_allreduce, hierarchical_neighbor_allreduce and "
                             "gradient_allreduce train them")
        if config.timeline is not None and "BLUEFOG_TIMELINE" not in os.environ:
            # Bluefog's own timeline (per tensor: forward, enqueue, fusion, communicate)
            # beside commbench's, one file per rank; set before bf.init() reads it. One
            # given to bfrun (--timeline-filename) stays.
            prefix = engine_timeline_prefix(config.timeline)
            taken = sorted(glob.glob(glob.escape(prefix) + "*.json"))
            if taken:
                raise UsageError(f"argument --timeline: {taken[0]} (Bluefog's own timeline) "
                                 "exists; commbench never overwrites a measurement")
            os.environ["BLUEFOG_TIMELINE"] = prefix

    def _init(self):
        if self.ctx.device.type == "cuda" and not ops_on_cpu():
            # Bluefog 0.3.0 as built here has no NCCL and would hand CUDA pointers to an
            # MPI that is not CUDA-aware; with BLUEFOG_OPS_ON_CPU=1 it copies them to the
            # host for each operation, which is correct (and is recorded).
            raise UsageError(f"argument --dist-optimizer: {self.name} on GPUs needs "
                             "BLUEFOG_OPS_ON_CPU=1 (Bluefog is built without NCCL here), "
                             "or pass --no-cuda")
        import bluefog.torch as bf

        wait_without_the_gil(bf)
        bf.init()
        if (bf.rank(), bf.size()) != (self.ctx.rank, self.ctx.world_size):
            raise UsageError(f"Bluefog sees rank {bf.rank()} of {bf.size()} but the "
                             f"launcher said {self.ctx.rank} of {self.ctx.world_size}")
        return bf

    def facts(self) -> Dict[str, Any]:
        from commbench.result.environment import package_version

        facts = {"engine": "bluefog", "bluefog_version": package_version("bluefog")}
        if os.environ.get("BLUEFOG_TIMELINE"):
            facts["engine_timeline"] = os.environ["BLUEFOG_TIMELINE"] + "<rank>.json"
        if self.ctx.device.type == "cuda":
            facts["ops_on_cpu"] = ops_on_cpu()
        return facts


def engine_timeline_prefix(timeline: str) -> str:
    """Where Bluefog writes its timeline beside commbench's: trace.json ->
    trace.bluefog.<rank>.json (Bluefog appends the rank and ".json" to the prefix)."""
    beside = trace_file.beside(timeline, "bluefog")
    return (beside[:-len(".json")] if beside.endswith(".json") else beside) + "."


def ops_on_cpu() -> bool:
    return os.environ.get("BLUEFOG_OPS_ON_CPU") == "1"


def _graph(weights):
    """Bluefog's graph of a commbench mixing matrix: W[i, j] is what i gives j's
    value; Bluefog's edge j -> i carries that weight (GetRecvWeights reads A[j, i])."""
    import networkx as nx

    return nx.from_numpy_array(weights.T, create_using=nx.DiGraph)


class _BluefogMixing(_Bluefog, MixingStrategy):
    """Bluefog's AWC/ATC optimizers on commbench's schedule; Bluefog mixes."""

    communication = "neighbor_allreduce"

    def wrap(self, model, optimizer) -> TrainStep:
        bf = self._init()
        self._set_topology(bf)
        opt = self._optimizer(bf, model, optimizer)
        train = TrainingStep(model, opt)  # Bluefog's optimizer communicates in its step()
        if not self.schedule.dynamic:
            return train
        schedule, node, counter = self.schedule, self.node(), [0]

        def step(images, labels):
            self._set_step_weights(opt, schedule.at(counter[0]), node)
            counter[0] += 1
            return train(images, labels)

        return step

    def _optimizer(self, bf, model, optimizer):
        kind = bf.CommunicationType.__members__[self.communication]
        if self.config.atc_style:
            return bf.DistributedAdaptThenCombineOptimizer(optimizer, model=model,
                                                           communication_type=kind)
        return bf.DistributedAdaptWithCombineOptimizer(optimizer, model=model,
                                                       communication_type=kind)

    def _set_topology(self, bf) -> None:
        if not bf.set_topology(_graph(self._static_graph().weights), is_weighted=True):
            raise UsageError(f"Bluefog refused topology {self.config.topology!r}")

    def _static_graph(self):
        """The static W of --topology over this strategy's nodes."""
        from commbench.topology import build_topology

        return build_topology(self.config.topology, self.nodes())

    def _set_step_weights(self, opt, topology, node) -> None:
        """This step's graph, as Bluefog's benchmark sets it from its generators."""
        opt.self_weight = topology.self_weight(node)
        opt.src_weights = dict(topology.in_neighbors(node))
        opt.dst_weights = {d: 1.0 for d in topology.out_neighbors(node)}
        opt.enable_topo_check = False

    def facts(self) -> Dict[str, Any]:
        return {**_Bluefog.facts(self), **MixingStrategy.facts(self)}


class BluefogNeighborAllreduce(_BluefogMixing):
    name = "bluefog.neighbor_allreduce"
    summary = ("Bluefog's own AWC/ATC optimizer with neighbor_allreduce (W of --topology, "
               "static or dynamic); MPI launchers only")


class BluefogHierarchicalNeighborAllreduce(_BluefogMixing):
    name = "bluefog.hierarchical_neighbor_allreduce"
    summary = ("Bluefog's own optimizer with hierarchical neighbor allreduce (machines are "
               "super-nodes); needs >= 2 real machines")
    communication = "hierarchical_neighbor_allreduce"

    @classmethod
    def nodes_before_init(cls, config, launch) -> int:
        return launch.world_size // launch.local_size if launch.local_size else 1

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

    def _init(self):
        if self.unfixed_release():
            hierarchical_as_fixed_upstream()
        return super()._init()

    @staticmethod
    def unfixed_release() -> bool:
        from commbench.result.environment import package_version

        return package_version("bluefog") in HIERARCHICAL_UNFIXED

    def facts(self) -> Dict[str, Any]:
        facts = {**super().facts(), "machine_size": self.ctx.machine_size,
                 "num_machines": self.ctx.num_machines, "simulated_machines": False}
        if self.unfixed_release():
            facts["bluefog_fixes"] = ("hierarchical call translated to the op's arguments; "
                                      "tensor fusion off (BLUEFOG_FUSION_THRESHOLD=0)")
        return facts

    def nodes(self) -> int:
        return self.ctx.num_machines

    def node(self) -> int:
        return self.ctx.machine

    def schedule_machine_size(self):
        return None  # the nodes are machines already

    def _set_topology(self, bf) -> None:
        if not bf.set_machine_topology(_graph(self._static_graph().weights), is_weighted=True):
            raise UsageError(f"Bluefog refused machine topology {self.config.topology!r}")

    def _set_step_weights(self, opt, topology, node) -> None:
        opt.self_weight = topology.self_weight(node)
        # 0.3.0's names, then those of Bluefog's later sources
        opt.neighbor_machine_weights = dict(topology.in_neighbors(node))
        opt.send_neighbor_machines = list(topology.out_neighbors(node))
        opt.src_machine_weights = opt.neighbor_machine_weights
        opt.dst_machine_weights = {d: 1.0 for d in opt.send_neighbor_machines}
        opt.enable_topo_check = False


class BluefogWinPut(_BluefogMixing):
    name = "bluefog.win_put"
    summary = ("Bluefog's one-sided DistributedWinPutOptimizer: parameters put into the "
               "out-neighbors' MPI windows, never waiting for them (W of --topology, "
               "static or dynamic); MPI launchers only")

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        if config.atc_style:
            raise UsageError(f"argument --atc-style: means nothing to {cls.name}, which "
                             "averages what its window holds before each update; leave it "
                             "out")

    def _optimizer(self, bf, model, optimizer):
        self._bf = bf
        return bf.DistributedWinPutOptimizer(optimizer, model=model)

    def settle(self) -> None:
        """A put over TCP completes only while its target is inside MPI: a rank that
        went on to commbench's gloo collectives would hold up its peers' last puts,
        and they it. Bluefog's barrier keeps every rank in MPI until all arrive."""
        self._bf.barrier()

    def _set_step_weights(self, opt, topology, node) -> None:
        """This step's out-neighbors receive the put; the average keeps the static W
        over every in-neighbor's latest put (Bluefog's benchmark does the same)."""
        opt.dst_weights = {d: 1.0 for d in topology.out_neighbors(node)}


class BluefogGradientAllreduce(_Bluefog):
    name = "bluefog.gradient_allreduce"
    summary = "Bluefog's own DistributedGradientAllreduceOptimizer; MPI launchers only"

    def wrap(self, model, optimizer) -> TrainStep:
        bf = self._init()
        bf.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = bf.DistributedGradientAllreduceOptimizer(optimizer, model=model)
        return TrainingStep(model, opt)
