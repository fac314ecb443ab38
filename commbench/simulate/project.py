"""Projected rows: each strategy at each worker count, with the band its calibration's
uncertainty spans, the straggler term apart, and whether the worker count lies within
what was measured (validated) or beyond it (extrapolated). Stragglers made on purpose
(--slow-ranks) are in every row's step (commbench.simulate.stragglers)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from commbench.simulate import costs
from commbench.simulate import stragglers as injected
from commbench.simulate.compute import Compute, Gradients
from commbench.simulate.link_costs import Network
from commbench.simulate.step import StepTime, simulate
from commbench.simulate.strategy import Strategy


@dataclass
class Inputs:
    batch_size: int
    gradients: Gradients
    network: Network
    per_machine: int
    compute: Dict[int, Compute]  # by worker count; the smallest serves where none is
    algorithms: Tuple[str, ...] = ("ring", "tree")
    bytes_per_element: float = 4.0
    measured: Dict[Tuple[str, int], Tuple[float, Optional[float]]] = field(default_factory=dict)
    # Share of the communication a strategy's schedule overlaps with backward that is
    # really hidden: 1 where communication has its own engine (NCCL on GPUs); lower on
    # CPUs, where the transport and the compute share the cores (fit_overlap). Per
    # strategy label where fitted, `overlap` for the others.
    overlap: float = 1.0
    overlaps: Dict[str, float] = field(default_factory=dict)
    # commbench's hierarchical step between machines runs in pieces of this size over
    # gloo (what `auto` picks there on CPUs); None: whole buffers (NCCL, MPI)
    pipeline_bytes: Optional[int] = None
    # stragglers made on purpose (--slow-ranks, commbench.simulate.stragglers)
    slow_ranks: str = "none"
    # per strategy label, its compression codec's measured seconds per step
    codec: Dict[str, float] = field(default_factory=dict)

    def compute_at(self, workers: int) -> Compute:
        if workers in self.compute:
            return self.compute[workers]
        below = [n for n in self.compute if n <= workers]
        return self.compute[max(below) if below else min(self.compute)]

    def validated(self, label: str) -> int:
        """The largest worker count at which `label` was measured (0: never)."""
        return max((n for s, n in self.measured if s == label), default=0)


@dataclass
class Row:
    strategy: str
    workers: int
    machines: int
    img_sec: float
    low: float  # the band: slow compute and network ...
    high: float  # ... to fast ones
    efficiency: float
    step: StepTime
    with_stragglers: Optional[float]  # img/sec with the straggler term; None: no samples
    wait: Optional[float]  # the straggler term, seconds per step
    basis: str  # "measured", "within", "extrapolated" or "unvalidated"
    measured: Optional[float] = None
    measured_ci: Optional[float] = None
    # (how many, their img/sec): the first steps where they run otherwise than the rest
    # (PowerSGD's, sent whole); in time to a target, not in img_sec
    first_steps: Optional[Tuple[int, float]] = None

    @property
    def error(self) -> Optional[float]:
        return None if self.measured is None else self.img_sec / self.measured - 1


def project(strategies: List[Strategy], workers: List[int], inputs: Inputs) -> List[Row]:
    single = inputs.batch_size / inputs.compute_at(1).seconds  # one worker, no communication
    rows = []
    for strategy in strategies:
        label = strategy.label()
        validated = inputs.validated(label)
        for n in workers:
            layout = costs.Layout(n, inputs.per_machine)
            compute = inputs.compute_at(n)

            def step(compute: Compute, net: Network, stragglers: bool = False,
                     strategy: Strategy = strategy) -> StepTime:
                found = interfered(simulate(strategy, layout, compute, inputs.gradients, net,
                                            stragglers, inputs.algorithms,
                                            inputs.bytes_per_element, inputs.pipeline_bytes),
                                   inputs.overlaps.get(strategy.label(), inputs.overlap))
                slowed_on_purpose = injected.wait_seconds(strategy, layout, inputs.slow_ranks,
                                                          compute.seconds)
                return replace(found, wait=found.wait + slowed_on_purpose,
                               codec=inputs.codec.get(strategy.label(), 0.0))

            plain = step(compute, inputs.network)
            total = n * inputs.batch_size / plain.total
            whole = step(compute, inputs.network, strategy=strategy.uncompressed()) \
                if strategy.whole_steps else None
            bounds = [n * inputs.batch_size / step(compute.bound(side),
                                                   inputs.network.bound(side)).total
                      for side in (1, -1)]
            slowed = step(compute, inputs.network, True) if compute.batch_samples else None
            measured = inputs.measured.get((label, n))
            rows.append(Row(
                label, n, layout.machines, total, min(bounds), max(bounds),
                total / (n * single), plain,
                n * inputs.batch_size / slowed.total if slowed else None,
                slowed.wait if slowed else None,
                "measured" if measured else "unvalidated" if not validated
                else "within" if n <= validated else "extrapolated",
                *(measured or (None, None)),
                (strategy.whole_steps, n * inputs.batch_size / whole.total) if whole else None))
    return rows


def interfered(step: StepTime, overlap: float) -> StepTime:
    """The step when only `overlap` of its overlapped communication stays hidden."""
    lost = (1 - overlap) * step.overlapped
    return replace(step, exposed=step.exposed + lost, overlapped=step.overlapped - lost)


def fit_overlap(strategies: List[Strategy], workers: int, inputs: Inputs,
                stragglers: bool = False) -> Dict[str, float]:
    """Per strategy measured at `workers` whose schedule overlaps communication: the
    overlap efficiency in [0, 1] that makes the model (with or without its straggler
    term) meet the measurement. How much overlap survives depends on the pattern: a
    DDP bucket's allreduce and a neighbor exchange load the cores differently."""
    fitted = {}
    for strategy in strategies:
        measured = inputs.measured.get((strategy.label(), workers))
        if not measured:
            continue
        ideal = simulate(strategy, costs.Layout(workers, inputs.per_machine),
                         inputs.compute_at(workers), inputs.gradients, inputs.network,
                         stragglers, inputs.algorithms, inputs.bytes_per_element,
                         inputs.pipeline_bytes)
        if ideal.overlapped <= 0:
            continue
        seconds = workers * inputs.batch_size / measured[0]
        hidden = 1 - (seconds - ideal.total) / ideal.overlapped
        fitted[strategy.label()] = min(max(hidden, 0.0), 1.0)
    return fitted
