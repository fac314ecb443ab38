"""One training step of each strategy on a timeline, overlapping communication with
compute exactly where the strategy's code does (commbench.optimizers), and for the
engines' own plugins where the engine's code does (commbench.simulate.engines):

allreduce            DDP: bucket b's allreduce starts when backward has produced its
                     gradients and the previous bucket's is done; the optimizer runs
                     after the last one lands
horovod              Horovod's background thread: each cycle it negotiates which
                     gradients every rank has ready and launches them fused, one buffer
                     after the other
gradient_allreduce   one allreduce per gradient, launched as it is ready
neighbor_allreduce   AWC posts the whole parameter buffer right after forward and
                     waits for it after backward; ATC exchanges after the step
hierarchical_neighbor_allreduce
                     the machine's allreduce starts after forward (AWC); after backward
                     the machine leaders exchange, then broadcast inside the machine;
                     over gloo in pieces (pipeline_bytes): exchanges behind the next
                     pieces' sums, broadcasts behind the next pieces' exchanges
bluefog.neighbor_allreduce, bluefog.hierarchical_neighbor_allreduce
                     Bluefog's optimizer posts every parameter after forward (AWC; ATC:
                     each one from its gradient hook), its background thread negotiates
                     and fuses them; the machine allreduce, the leaders' exchange and
                     the broadcast of each fused buffer run one after the other
none                 compute only

allreduce with PowerSGD
                     torch's hook: per bucket, once backward has produced it, the
                     gradients sent whole, then the P factors, then the Q factors, three
                     allreduces (commbench.simulate.powersgd)

T_step = compute + exposed communication + coordination + straggler wait + codec, where
coordination is what the engine's cycle and negotiation add to the step and codec the
compression's own work where it holds the step up (taken from the measured split).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from commbench.simulate import costs, engines, powersgd
from commbench.simulate.compute import Compute, Gradients
from commbench.simulate.link_costs import Network
from commbench.simulate.strategy import PERIODIC, Strategy

@dataclass(frozen=True)
class StepTime:
    compute: float
    exposed: float  # communication the step waits for
    overlapped: float  # communication hidden behind compute
    wait: float  # waiting for the slowest worker the step depends on
    algorithm: str = "-"  # the allreduce algorithm, where there is one
    coordination: float = 0.0  # what the engine's cycle and negotiation add to the step
    codec: float = 0.0  # compressing and decompressing where it holds the step up

    @property
    def total(self) -> float:
        return self.compute + self.exposed + self.coordination + self.wait + self.codec


def simulate(strategy: Strategy, layout: costs.Layout, compute: Compute, grads: Gradients,
             net: Network, stragglers: bool, algorithms: Tuple[str, ...] = ("ring", "tree"),
             bytes_per_element: float = 4.0,
             pipeline_bytes: Optional[float] = None) -> StepTime:
    """One step. pipeline_bytes: the piece size of commbench's hierarchical step
    between machines (commbench.comm.machine_averaging.PIPELINE_BYTES of the transport
    the runs take; None: whole buffers, one phase after the other)."""
    scale = (strategy.bytes_per_element or bytes_per_element) / 4.0  # 2-byte types: half
    name = strategy.name
    if name == "none" or layout.workers == 1:
        return StepTime(compute.seconds, 0.0, 0.0, 0.0)
    if name in ("allreduce", "horovod", "gradient_allreduce"):
        posted = _posted(name, grads, compute, scale)
        if strategy.powersgd:
            posted = [(b, r * compute.backward)
                      for b, r in powersgd.messages(grads, *strategy.powersgd)]
        engine = strategy.engine()
        negotiation = engines.negotiation_seconds(engine, layout.workers, layout.local, net)
        fused = engines.launches(engine, posted, negotiation)

        def one(nbytes: float) -> Tuple[float, str]:
            return costs.hierarchical_allreduce(nbytes, layout, net) \
                if strategy.hierarchical_allreduce else costs.allreduce(nbytes, layout, net,
                                                                        algorithms)
        wait = compute.slowest_of(layout.workers) if stragglers else 0.0
        return _timeline(fused, engines.at_readiness(fused, posted), one, compute, wait)
    if name.startswith("bluefog."):
        return _bluefog_step(strategy, layout, compute, grads, net, stragglers, scale)
    if name == "neighbor_allreduce":
        load = costs.exchange(strategy.topology, layout.workers, strategy.dynamic,
                              layout.local if layout.machines > 1 else layout.workers)
        comm = costs.exchange_seconds(load, grads.total * scale, net)
        wait = compute.slowest_of(load.in_degree + 1) if stragglers else 0.0
        return _combine_step(compute, comm, 0.0, strategy.atc, wait)
    if name == "hierarchical_neighbor_allreduce":
        return _hierarchical_step(strategy, layout, compute, grads.total * scale, net,
                                  stragglers, pipeline_bytes)
    if name in PERIODIC:
        return _periodic_step(strategy, layout, compute, grads.total * scale, net,
                              stragglers, algorithms)
    raise ValueError(f"no cost model for strategy {name!r}")


def _periodic_step(strategy: Strategy, layout: costs.Layout, compute: Compute,
                   nbytes: float, net: Network, stragglers: bool,
                   algorithms: Tuple[str, ...]) -> StepTime:
    """The mean step of a strategy that meets every H-th step: every step computes, and
    one in H allreduces the model (diloco's pseudo-gradients; half the bytes in bf16)
    after the update, exposed, waiting then for the slowest worker; with h1,h2 one in h1
    also allreduces inside each machine, where it does not meet over all."""
    if strategy.outer_bf16:
        nbytes /= 2
    everywhere, algorithm = costs.allreduce(nbytes, layout, net, algorithms)
    exposed = everywhere / strategy.every[-1]
    if len(strategy.every) == 2 and layout.local > 1:
        inside, _ = costs.allreduce(nbytes, costs.Layout(layout.local, layout.local), net,
                                    algorithms)
        exposed += inside * (1 / strategy.every[0] - 1 / strategy.every[1])
    wait = compute.slowest_of(layout.workers) / strategy.every[-1] if stragglers else 0.0
    return StepTime(compute.seconds, exposed, 0.0, wait, algorithm)


def _posted(name: str, grads: Gradients, compute: Compute,
            scale: float) -> List[Tuple[float, float]]:
    """(bytes sent, time after forward it is handed over) of each allreduce's input: DDP's
    buckets, or each gradient as backward produces it (Horovod's hooks, and
    gradient_allreduce's)."""
    if name == "allreduce":
        return [(b * scale, r * compute.backward) for b, r in grads.buckets()]
    return [(b * scale, r * compute.backward) for b, r in zip(grads.nbytes, grads.ready)]


def _timeline(fused: Sequence[Tuple[float, float]], ideal: Sequence[Tuple[float, float]],
              cost: Callable[[float], Tuple[float, str]], compute: Compute,
              wait: float) -> StepTime:
    """Buffers (bytes, launch time after forward) sent one after the other on one
    stream; the step waits after backward for the last. `ideal`: the same buffers
    launched when ready, without the engine's cycle and negotiation, whose difference
    is the coordination part."""
    seconds = {nbytes: cost(nbytes) for nbytes, _ in fused}

    def finish(buffers) -> float:
        free = 0.0
        for nbytes, at in buffers:
            free = max(free, at) + seconds[nbytes][0]
        return free

    busy = sum(seconds[nbytes][0] for nbytes, _ in fused)
    end, end_ideal = finish(fused), finish(ideal)
    late = max(0.0, end - compute.backward)
    coordination = min(late, max(0.0, end - end_ideal))
    used = sorted({seconds[nbytes][1] for nbytes, _ in fused} - {"-"})
    return StepTime(compute.seconds, late - coordination, max(0.0, busy - late), wait,
                    "+".join(used) or "-", coordination)


def _bluefog_step(strategy, layout, compute, grads, net, stragglers, scale) -> StepTime:
    """Bluefog's _DistributedReduceOptimizer posts each parameter from a forward hook on
    the model (AWC), _DistributedAdaptThenCombineOptimizer from each parameter's
    gradient hook after its local step (ATC); NCCLController::NeighborAllreduce sends a
    fused buffer to its out-neighbors in one group, or for the hierarchical kind
    allreduces it inside the machine, lets local rank 0 exchange it with the neighbor
    machines' and broadcasts what came back."""
    g, m = layout.local, layout.machines
    machines = strategy.base == "hierarchical_neighbor_allreduce" and m > 1 and g > 1
    load = costs.exchange(strategy.topology, m, strategy.dynamic, 1) if machines else \
        costs.exchange(strategy.topology, layout.workers, strategy.dynamic,
                       g if m > 1 else layout.workers)
    inside = costs.Layout(g, g)

    def one(nbytes: float) -> Tuple[float, str]:
        if strategy.base == "neighbor_allreduce" or g == 1:
            return costs.exchange_seconds(load, nbytes, net), "-"
        local, _ = costs.allreduce(nbytes, inside, net, ("ring",))
        if m == 1:
            return local, "-"
        return (local + costs.exchange_seconds(load, nbytes, net)
                + costs.broadcast(nbytes * load.in_degree, g, net.intra)), "-"

    if strategy.atc:
        posted = [(b * scale, r * compute.backward) for b, r in zip(grads.nbytes, grads.ready)]
    else:
        posted = [(b * scale, 0.0) for b in grads.nbytes]
    engine = strategy.engine()
    negotiation = engines.negotiation_seconds(engine, layout.workers, g, net)
    fused = engines.launches(engine, posted, negotiation, load.in_degree)
    # the negotiation launches a tensor only once every rank has posted it: each step
    # waits for the slowest of all ranks, not only for its neighbors
    wait = compute.slowest_of(layout.workers) if stragglers else 0.0
    return _timeline(fused, engines.at_readiness(fused, posted), one, compute, wait)


def _combine_step(compute: Compute, comm: float, after: float, atc: bool,
                  wait: float) -> StepTime:
    """AWC: comm runs during backward; ATC: after the step. `after`: communication
    that cannot overlap in either style."""
    exposed = comm if atc else max(0.0, comm - compute.backward)
    return StepTime(compute.seconds, exposed + after, comm - exposed, wait)


def _hierarchical_step(strategy, layout, compute, nbytes, net, stragglers,
                       pipeline_bytes) -> StepTime:
    g, m = layout.local, layout.machines
    if m == 1:
        inside, _ = costs.allreduce(nbytes, costs.Layout(g, g), net, ("ring",))
        wait = compute.slowest_of(g) if stragglers else 0.0
        return _combine_step(compute, inside, 0.0, strategy.atc, wait)
    load = costs.exchange(strategy.topology, m, strategy.dynamic, 1)
    wait = compute.slowest_of((load.in_degree + 1) * g) if stragglers else 0.0
    if g == 1:  # machines of one rank: plain neighbor averaging, overlapped as such
        between = costs.exchange_seconds(load, nbytes, net)
        return _combine_step(compute, between, 0.0, strategy.atc, wait)
    stages = [(costs.allreduce(size, costs.Layout(g, g), net, ("ring",))[0],
               costs.exchange_seconds(load, size, net), costs.broadcast(size, g, net.intra))
              for size in _pieces(nbytes, pipeline_bytes)]
    if strategy.atc:  # after the step: nothing hides
        return StepTime(compute.seconds, _pipeline_end(stages, 0.0), 0.0, wait)
    # AWC: the sums start after forward and run during backward; the rest after it
    summing = sum(piece[0] for piece in stages)
    exposed = _pipeline_end(stages, compute.backward)
    return StepTime(compute.seconds, exposed, min(summing, compute.backward), wait)


def _pieces(nbytes: float, pipeline_bytes: Optional[float]) -> List[float]:
    """The sizes of the pieces of a buffer of nbytes: whole (None), or full pieces and
    what is left."""
    if not pipeline_bytes or nbytes <= pipeline_bytes:
        return [nbytes]
    full = int(nbytes // pipeline_bytes)
    rest = nbytes - full * pipeline_bytes
    return [pipeline_bytes] * full + ([rest] if rest > 0 else [])


def _pipeline_end(stages: List[Tuple[float, float, float]], after: float) -> float:
    """How long after `after` (the end of backward for AWC, else 0) the last piece's
    broadcast ends, given each piece's (sum, exchange, broadcast) seconds, ordered as
    MachineAveraging.finish orders them: the sums one after the other from time 0; a
    piece's exchange once it is summed, `after` has passed and the previous exchange
    is done (one link); the broadcasts once every piece is summed, each after its own
    exchange and the previous broadcast (one group). So exchanges run behind the next
    pieces' sums, and broadcasts behind the next pieces' exchanges; with one piece,
    the three phases one after the other."""
    summed = exchanged = broadcast = 0.0
    every_summed = max(sum(piece[0] for piece in stages), after)
    for sum_seconds, exchange_seconds, broadcast_seconds in stages:
        summed += sum_seconds
        exchanged = max(summed, after, exchanged) + exchange_seconds
        broadcast = max(exchanged, every_summed, broadcast) + broadcast_seconds
    return broadcast - after
