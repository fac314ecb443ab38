"""Engines as they schedule: when each message of a step leaves, fused with which
others, and what the engine spends deciding that. Read off the engines' code (file
and function of each figure: docs/simulate.md, "Engines as they schedule").

Horovod and Bluefog hand tensors to a background thread that wakes once per cycle,
agrees with every other rank on which tensors all of them have ready (the
negotiation), fuses those into buffers up to a threshold and launches one collective
per buffer, one after the other on one stream:

- Horovod: with its response cache warm (every step after the first), the
  negotiation is one MPI_Allreduce (bitwise AND) of a bit vector, one bit per cached
  tensor; a cache miss goes through rank 0 (gather the requests, broadcast the
  responses). Defaults differ by release (0.20: 5 ms cycles, 64 MB buffers; 0.21 on:
  1 ms, 128 MB).
- Bluefog: no response cache, so every cycle with work gathers the requests at rank 0
  and broadcasts the responses. A fused neighbor_allreduce buffer also holds what it
  receives, so it carries threshold / (1 + in-neighbors) bytes of parameters.
- DDP: no background thread and no negotiation: a bucket's allreduce is launched by
  the autograd hook that fills it.

The cost of a negotiation counts its latency rounds on each link class (the controller's
messages are tens of bytes); a binomial tree or recursive doubling over ranks placed
machine by machine takes log2(ranks per machine) rounds inside a machine and
log2(machines) across.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from commbench.errors import UsageError
from commbench.simulate.link_costs import Network

CACHE = "response-cache"  # one bitwise allreduce per cycle
GATHER = "gather-broadcast"  # requests gathered at rank 0, responses broadcast
NONE = "none"


@dataclass(frozen=True)
class Engine:
    """An engine's scheduling defaults. cycle: seconds between background-thread
    cycles (0: launched when ready); fusion_bytes: the fusion buffer's size;
    negotiation: CACHE, GATHER or NONE; fused_receives: a fused buffer also holds
    what is received from each in-neighbor (Bluefog's neighbor_allreduce)."""

    name: str
    version: str
    cycle: float
    fusion_bytes: float
    negotiation: str
    fused_receives: bool = False

    def label(self) -> str:
        if self.negotiation == NONE:
            return self.name
        return (f"{self.name} {self.version}: cycle {self.cycle * 1e3:g} ms, fusion "
                f"{self.fusion_bytes / 2 ** 20:g} MiB, negotiation by {self.negotiation}")


# horovod/common/operations.cc, InitializeHorovodOnce's defaults (SetCycleTimeMs,
# SetTensorFusionThresholdBytes); global_state.h: cache_capacity 1024.
# By release line, the same defaults throughout (read at v0.21.0 and v0.28.1; at v0.17.0,
# the first with response_cache.cc, v0.19.0 and v0.20.0; at v0.13.0, whose RunLoopOnce
# sleeps 5 ms, and v0.16.0).
HOROVOD: Dict[str, Engine] = {
    "0.28": Engine("horovod", "0.21-0.28", 1e-3, 128 << 20, CACHE),
    "0.20": Engine("horovod", "0.17-0.20", 5e-3, 64 << 20, CACHE),
    "0.16": Engine("horovod", "0.13-0.16", 5e-3, 64 << 20, GATHER),
}
HOROVOD_DEFAULT = "0.28"  # the line of 0.28.1, which commbench's horovod plugin builds
# bluefog/common/global_state.h: cycle_time_ms 0.5, tensor_fusion_threshold 8 MiB (the
# same at the commit that published Bluefog's benchmark charts and at v0.3.0).
BLUEFOG = Engine("bluefog", "0.3.0", 0.5e-3, 8 << 20, GATHER, fused_receives=True)
DDP = Engine("ddp", "-", 0.0, 0.0, NONE)


def horovod(version: str = HOROVOD_DEFAULT) -> Engine:
    if version not in HOROVOD:
        raise UsageError(f"argument --horovod-version: no defaults known for {version!r}; "
                         f"known: {', '.join(HOROVOD)}")
    return HOROVOD[version]


def tree_rounds(ranks: int, per_machine: int, net: Network) -> float:
    """Seconds of the latency rounds of one binomial tree (or recursive doubling) over
    `ranks` ranks placed `per_machine` to a machine."""
    local = min(ranks, per_machine)
    machines = max(1, ranks // per_machine)
    return (math.ceil(math.log2(local)) * net.intra.alpha if local > 1 else 0.0) + \
        (math.ceil(math.log2(machines)) * net.inter.alpha if machines > 1 else 0.0)


def negotiation_seconds(engine: Engine, ranks: int, per_machine: int, net: Network) -> float:
    """Seconds one cycle's negotiation takes before anything is launched.

    CACHE: Horovod's CacheCoordinator::sync, one MPI_Allreduce of the bit vector.
    GATHER: Bluefog's NegotiateOfRequestOfMaster/OfSlave: MPI_Gather of the request
    sizes, MPI_Gatherv of the requests (rank 0 waits on all at once: one round across
    machines), MPI_Bcast of the response size and of the responses."""
    if engine.negotiation == NONE or ranks <= 1:
        return 0.0
    tree = tree_rounds(ranks, per_machine, net)
    if engine.negotiation == CACHE:
        return tree
    across = net.inter.alpha if ranks > per_machine else net.intra.alpha
    return 3 * tree + across


def launches(engine: Engine, posted: Sequence[Tuple[float, float]], negotiation: float,
             receives: float = 0.0) -> List[Tuple[float, float]]:
    """(bytes, launch time) of each fused buffer, in launch order, from (bytes, time
    posted) of each tensor in the order the engine's queue holds them. A tensor goes
    in the first cycle that starts after it is posted (a cycle longer than the cycle
    time, because its negotiation is, starts the next at once); a cycle's tensors are
    fused in order until the next would pass the threshold (FuseResponses)."""
    if engine.negotiation == NONE:
        return [(float(b), float(t)) for b, t in posted]
    period = max(engine.cycle, negotiation)
    per_byte = 1.0 + (receives if engine.fused_receives else 0.0)
    fused: List[Tuple[float, float]] = []
    for nbytes, at in posted:
        launch = period * (math.floor(at / period) + 1) + negotiation
        same_cycle = bool(fused) and fused[-1][1] == launch
        if same_cycle and (fused[-1][0] + nbytes) * per_byte <= engine.fusion_bytes:
            fused[-1] = (fused[-1][0] + nbytes, launch)
        else:
            fused.append((float(nbytes), launch))
    return fused


def at_readiness(fused: Sequence[Tuple[float, float]], posted: Sequence[Tuple[float, float]]
                 ) -> List[Tuple[float, float]]:
    """The same buffers launched as soon as their last tensor is posted: what the step
    would take without the cycle and the negotiation (the split's coordination part
    is the difference)."""
    out, index = [], 0
    for nbytes, _ in fused:
        taken, ready = 0.0, 0.0
        while taken < nbytes - 0.5 and index < len(posted):
            taken += posted[index][0]
            ready = max(ready, posted[index][1])
            index += 1
        out.append((nbytes, ready))
    return out
