"""The communication of each strategy per step, in closed form: how many bytes cross
which link class, how many messages lie on the critical path, and how many flows share
a machine's NIC. Ranks sit on machines as launchers place them: rank r on machine
r // per_machine.

Allreduce follows NCCL's cost model: a ring's 2(p-1) steps (2(M-1) of them between
machines) move 2(p-1)/p·S per rank; a double binary tree pays 2·log2 steps of latency
but moves about 2·S per rank. Which of the two runs is NCCL's decision, made by its own
tuning model (nccl_algorithm: NCCL 2.7.8's tables); what it costs is this model's, on
the projection's links (gloo and MPI on CPUs: ring only).
Neighbor exchanges are read off the strategy's own schedule (commbench.topology), so
every topology and dynamic schedule commbench runs is costed as it runs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from commbench.errors import UsageError
from commbench.simulate.link_costs import Link, Network

FITTED_OPS = ("allreduce", "neighbor_allreduce")
# Phases of a dynamic schedule that are costed (their mean is the step's): one-peer
# schedules repeat every out-degree (<= log2 p) steps; the inner-outer schedule's
# phases all load every link alike.
SCHEDULE_PHASES = 16


@dataclass(frozen=True)
class Layout:
    workers: int
    per_machine: int

    def __post_init__(self) -> None:
        if self.workers > self.per_machine and self.workers % self.per_machine:
            raise UsageError(f"{self.workers} workers do not fill machines of "
                             f"{self.per_machine}: give worker counts that do")

    @property
    def machines(self) -> int:
        return self.workers // self.per_machine if self.workers > self.per_machine else 1

    @property
    def local(self) -> int:
        """Ranks on each machine."""
        return min(self.workers, self.per_machine)


def allreduce(nbytes: float, layout: Layout, net: Network,
              algorithms: Tuple[str, ...] = ("ring", "tree")) -> Tuple[float, str]:
    """Seconds of one allreduce of nbytes per rank, and the algorithm it uses."""
    p, g, m = layout.workers, layout.local, layout.machines
    if p == 1 or nbytes == 0:
        return 0.0, "-"
    bottleneck = net.inter if m > 1 else net.intra
    beta = bottleneck.beta_at(nbytes, bottleneck.ring_flows)
    name = nccl_algorithm(nbytes, layout, net, algorithms)
    if name == "ring":
        return (2 * (p - 1) - 2 * (m - 1)) * net.intra.alpha + 2 * (m - 1) * net.inter.alpha \
            + 2 * (p - 1) / p * nbytes * beta, name
    return 2 * ((g - 1) * net.intra.alpha + math.ceil(math.log2(m)) * net.inter.alpha) \
        + 2 * nbytes * beta, name


# NCCL 2.7.8's tuning model, src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime)
# and src/enqueue.cc (getAlgoInfo: the algorithm and protocol of least modelled time).
# Latencies in us by (algorithm, protocol); LL128 is left out: NCCL enables it only where
# the NIC shares the GPU's PCIe switch.
NCCL_BASE_LATENCY = {("tree", "LL"): 4.4, ("tree", "Simple"): 0.0,
                     ("ring", "LL"): 3.6, ("ring", "Simple"): 8.4}
NCCL_HW_LATENCY = {
    "nvlink": {("tree", "LL"): 0.52, ("tree", "Simple"): 28.0,
               ("ring", "LL"): 0.47, ("ring", "Simple"): 3.4},
    "pci": {("tree", "LL"): 1.0, ("tree", "Simple"): 28.0,
            ("ring", "LL"): 1.0, ("ring", "Simple"): 5.7},
    "net": {("tree", "LL"): 5.0, ("tree", "Simple"): 50.0,
            ("ring", "LL"): 2.7, ("ring", "Simple"): 9.6},
}
NCCL_TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7,
               .8, .9),
}

def _log2i(n: int) -> int:
    return max(int(n), 1).bit_length() - 1


def nccl_algorithm(nbytes: float, layout: Layout, net: Network,
                   algorithms: Tuple[str, ...] = ("ring", "tree")) -> str:
    """The allreduce algorithm NCCL's tuning model picks for nbytes at this layout. Its
    bus bandwidth is the bottleneck link's large-message rate (NCCL's is its channels'
    speed, which its topology search caps at the NIC's); inside machines it takes
    NVLink's latencies (PCI's differ by at most 2.3 us a step and leave the tree's
    28 us, which decides, as it is)."""
    if len(algorithms) == 1:
        return algorithms[0]
    p, g, m = layout.workers, layout.local, layout.machines
    intra_hw = NCCL_HW_LATENCY["nvlink"]
    link = net.inter if m > 1 else net.intra
    bus = 1e6 if link.beta <= 0 else 1 / link.beta / 1e9  # GB/s
    steps, inter_steps = 2 * (p - 1), 2 * (m - 1)
    best, best_time = algorithms[0], math.inf
    for algorithm in algorithms:
        for protocol in ("LL", "Simple"):
            key = (algorithm, protocol)
            intra_lat = intra_hw[key] * (1.8 if m > 1 and protocol == "LL" else 1.0)
            inter_lat = NCCL_HW_LATENCY["net"][key]
            latency = NCCL_BASE_LATENCY[key]
            if algorithm == "ring":
                bw = bus / 4 if protocol == "LL" else bus
                bw *= p / steps
                latency += (steps - inter_steps) * intra_lat + inter_steps * inter_lat
                if protocol == "Simple" and m > 1 and nbytes >= p / 16 * 65536:
                    latency *= 1.9  # NCCL's "plateau effect of ring"
            else:
                bw = min(bus * 0.9, 80.0 if m > 2 else 110.0)
                bw = (bw / 3.8 if protocol == "LL" else bw) * 0.5
                latency += 2 * ((g - 1) * intra_lat + _log2i(m) * inter_lat)
                size_class = _log2i(int(nbytes) >> 6)
                if size_class < 22:
                    bw *= NCCL_TREE_CORRECTION[protocol][size_class]
            seconds = latency + nbytes / (1000 * bw)
            if seconds < best_time:
                best, best_time = algorithm, seconds
    return best


def hierarchical_allreduce(nbytes: float, layout: Layout, net: Network) -> Tuple[float, str]:
    """Horovod's --hierarchical-allreduce: reduce-scatter inside each machine, then the
    g ranks of a machine allreduce their S/g shares across machines at once (together
    S through the one NIC), then allgather inside the machine."""
    g, m = layout.local, layout.machines
    if m == 1:
        return allreduce(nbytes, layout, net, ("ring",))
    inside = (g - 1) * net.intra.alpha + (g - 1) / g * nbytes * net.intra.beta_at(nbytes)
    share = net.inter.beta_at(nbytes / g, g * net.inter.ring_flows)  # g rings at once
    across = 2 * (m - 1) * net.inter.alpha + 2 * (m - 1) / m * nbytes * share
    return 2 * inside + across, "hierarchical"


def broadcast(nbytes: float, ranks: int, link: Link) -> float:
    """A pipelined broadcast among `ranks` on one link class."""
    return 0.0 if ranks <= 1 else math.ceil(math.log2(ranks)) * link.alpha \
        + nbytes * link.beta_at(nbytes)


@dataclass(frozen=True)
class Exchange:
    """One step of a neighbor exchange in messages of S bytes: the busiest NIC's
    (largest of sent and received between machines), the busiest rank's inside its
    machine, and the largest in-degree (the neighbors a rank waits for)."""

    nic: float
    intra: float
    in_degree: float


@functools.lru_cache(maxsize=512)
def exchange(topology: str, nodes: int, dynamic: bool, per_machine: int) -> Exchange:
    """The mean over the schedule's phases of what one exchange step moves: nodes are
    ranks, per_machine of them to a machine (1: every node is its own machine)."""
    from commbench.topology import build_schedule

    machines = nodes // per_machine if nodes > per_machine else 1
    schedule = build_schedule(topology, nodes, dynamic,
                              per_machine if machines > 1 and per_machine > 1 else None)
    machine = np.arange(nodes) // per_machine
    phases = []
    for phase in range(min(schedule.period, SCHEDULE_PHASES)):
        w = schedule.at(phase).weights
        receiver, sender = np.nonzero(w)
        keep = receiver != sender
        receiver, sender = receiver[keep], sender[keep]
        crossing = machine[receiver] != machine[sender]
        out_nic = np.bincount(machine[sender[crossing]], minlength=machines)
        in_nic = np.bincount(machine[receiver[crossing]], minlength=machines)
        out_local = np.bincount(sender[~crossing], minlength=nodes)
        in_local = np.bincount(receiver[~crossing], minlength=nodes)
        phases.append((max(out_nic.max(), in_nic.max()), max(out_local.max(), in_local.max()),
                       np.bincount(receiver, minlength=nodes).max()))
    nic, intra, degree = np.mean(phases, axis=0)
    return Exchange(float(nic), float(intra), float(degree))


def exchange_seconds(load: Exchange, nbytes: float, net: Network) -> float:
    """An exchange's messages of nbytes each travel at once, each its own flow: the
    busiest link class decides."""
    net = net.for_exchange()
    nic = net.inter.seconds(load.nic * nbytes, size=nbytes, flows=load.nic) if load.nic else 0.0
    intra = net.intra.seconds(load.intra * nbytes, size=nbytes) if load.intra else 0.0
    return max(nic, intra)


def fit_point(doc: dict, row: dict, kind: str,
              intra: Optional[Link]) -> Optional[Tuple[float, float, float]]:
    """(messages, bytes, seconds) of one microbench row on the `kind` link class, as
    this module costs it; the intra part of a multi-machine allreduce is taken off
    with the intra link when it is known."""
    env, config = doc.get("environment") or {}, doc["config"]
    p = int(doc["summary"]["world_size"])
    hosts = env.get("hostnames") or ["?"] * p
    per_machine = p // len(set(hosts)) if kind == "inter" else p
    layout = Layout(p, per_machine)
    size, measured = float(row["bytes"]), float(row["summary"]["time"]["p50"])
    if row["op"] == "allreduce":
        if kind == "intra":
            return 2 * (p - 1), 2 * (p - 1) / p * size, measured
        m = layout.machines
        inside = (2 * (p - 1) - 2 * (m - 1)) * (intra.alpha if intra else 0.0)
        return 2 * (m - 1), 2 * (p - 1) / p * size, measured - inside
    load = exchange(config.get("topology") or "exponential-2", p,
                    not config.get("disable_dynamic_topology"),
                    per_machine if kind == "inter" else p)
    messages = load.nic if kind == "inter" else load.intra
    return (1.0, messages * size, measured) if messages else None
