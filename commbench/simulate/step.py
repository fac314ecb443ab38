"""One training step of each strategy on a timeline, overlapping communication with
compute exactly where the strategy's code does (commbench.optimizers):

allreduce            DDP: bucket b's allreduce starts when backward has produced its
                     gradients and the previous bucket's is done; the optimizer runs
                     after the last one lands
horovod              the same, with Horovod's fusion: what is ready at each cycle
                     (HOROVOD_CYCLE_TIME) goes out as one buffer
gradient_allreduce   one allreduce per gradient, launched as it is ready
neighbor_allreduce   AWC posts the whole parameter buffer right after forward and
                     waits for it after backward; ATC exchanges after the step
hierarchical_neighbor_allreduce
                     the machine's allreduce starts after forward (AWC); after backward
                     the machine leaders exchange, then broadcast inside the machine
none                 compute only

T_step = compute + exposed communication + straggler wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from commbench.simulate import costs
from commbench.simulate.compute import Compute, Gradients
from commbench.simulate.network import Network

STRATEGIES = ("allreduce", "horovod", "gradient_allreduce", "neighbor_allreduce",
              "hierarchical_neighbor_allreduce", "none")
HOROVOD_CYCLE_SECONDS = 1e-3  # Horovod's default HOROVOD_CYCLE_TIME
HOROVOD_FUSION_BYTES = 128 << 20  # Horovod's default HOROVOD_FUSION_THRESHOLD


@dataclass(frozen=True)
class Strategy:
    """A strategy as configured: decentralized ones by topology and schedule."""

    name: str
    topology: str = "exponential-2"
    dynamic: bool = True
    atc: bool = False
    hierarchical_allreduce: bool = False  # horovod's --hierarchical-allreduce

    def label(self) -> str:
        if self.hierarchical_allreduce:
            return f"{self.name} (hierarchical allreduce)"
        if self.name not in ("neighbor_allreduce", "hierarchical_neighbor_allreduce"):
            return self.name
        settings = [self.topology, "dynamic" if self.dynamic else "static"]
        if self.atc:
            settings.append("ATC")
        return f"{self.name} ({', '.join(settings)})"


@dataclass(frozen=True)
class StepTime:
    compute: float
    exposed: float  # communication the step waits for
    overlapped: float  # communication hidden behind compute
    wait: float  # waiting for the slowest worker the step depends on
    algorithm: str = "-"  # the allreduce algorithm, where there is one

    @property
    def total(self) -> float:
        return self.compute + self.exposed + self.wait


def simulate(strategy: Strategy, layout: costs.Layout, compute: Compute, grads: Gradients,
             net: Network, stragglers: bool, algorithms: Tuple[str, ...] = ("ring", "tree"),
             bytes_per_element: float = 4.0) -> StepTime:
    scale = bytes_per_element / 4.0  # --fp16-allreduce sends half the bytes
    name = strategy.name
    if name == "none" or layout.workers == 1:
        return StepTime(compute.seconds, 0.0, 0.0, 0.0)
    if name in ("allreduce", "horovod", "gradient_allreduce"):
        messages = _messages(name, grads, compute)
        return _allreduce_step(messages, scale, layout, compute, net, stragglers, algorithms,
                               strategy.hierarchical_allreduce)
    if name == "neighbor_allreduce":
        load = costs.exchange(strategy.topology, layout.workers, strategy.dynamic,
                              layout.local if layout.machines > 1 else layout.workers)
        comm = costs.exchange_seconds(load, grads.total * scale, net)
        wait = compute.slowest_of(load.in_degree + 1) if stragglers else 0.0
        return _combine_step(compute, comm, 0.0, strategy.atc, wait)
    if name == "hierarchical_neighbor_allreduce":
        return _hierarchical_step(strategy, layout, compute, grads.total * scale, net,
                                  stragglers)
    raise ValueError(f"no cost model for strategy {name!r}")


def _messages(name: str, grads: Gradients, compute: Compute) -> List[Tuple[float, float]]:
    """(bytes, ready time after forward) of each allreduce, in launch order."""
    if name == "allreduce":
        return [(b, r * compute.backward) for b, r in grads.buckets()]
    ready = [(b, r * compute.backward) for b, r in zip(grads.nbytes, grads.ready)]
    if name == "gradient_allreduce":
        return ready
    fused: List[Tuple[float, float]] = []  # horovod: one buffer per cycle
    for nbytes, at in ready:
        tick = HOROVOD_CYCLE_SECONDS * (int(at / HOROVOD_CYCLE_SECONDS) + 1)
        if fused and fused[-1][1] == tick and fused[-1][0] + nbytes <= HOROVOD_FUSION_BYTES:
            fused[-1] = (fused[-1][0] + nbytes, tick)
        else:
            fused.append((nbytes, tick))
    return fused


def _allreduce_step(messages, scale, layout, compute, net, stragglers, algorithms,
                    hierarchical: bool) -> StepTime:
    free, busy, used = 0.0, 0.0, set()
    for nbytes, ready in messages:
        seconds, algorithm = costs.hierarchical_allreduce(nbytes * scale, layout, net) \
            if hierarchical else costs.allreduce(nbytes * scale, layout, net, algorithms)
        used.add(algorithm)
        free = max(free, ready) + seconds
        busy += seconds
    exposed = max(0.0, free - compute.backward)
    wait = compute.slowest_of(layout.workers) if stragglers else 0.0
    return StepTime(compute.seconds, exposed, busy - exposed, wait, "+".join(sorted(used)))


def _combine_step(compute: Compute, comm: float, after: float, atc: bool,
                  wait: float) -> StepTime:
    """AWC: comm runs during backward; ATC: after the step. `after`: communication
    that cannot overlap in either style."""
    exposed = comm if atc else max(0.0, comm - compute.backward)
    return StepTime(compute.seconds, exposed + after, comm - exposed, wait)


def _hierarchical_step(strategy, layout, compute, nbytes, net, stragglers) -> StepTime:
    g, m = layout.local, layout.machines
    inside, _ = costs.allreduce(nbytes, costs.Layout(g, g), net, ("ring",))
    if m == 1:
        wait = compute.slowest_of(g) if stragglers else 0.0
        return _combine_step(compute, inside, 0.0, strategy.atc, wait)
    load = costs.exchange(strategy.topology, m, strategy.dynamic, 1)
    between = costs.exchange_seconds(load, nbytes, net)
    wait = compute.slowest_of((load.in_degree + 1) * g) if stragglers else 0.0
    if g == 1:  # machines of one rank: plain neighbor averaging, overlapped as such
        return _combine_step(compute, between, 0.0, strategy.atc, wait)
    back = costs.broadcast(nbytes, g, net.intra)
    return _combine_step(compute, inside, between + back, strategy.atc, wait)
