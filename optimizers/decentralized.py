"""What the decentralized strategies share: the AWC and ATC training steps around a
parameter mixer, and the checks of --topology / --machine-size / --cpu-transport
that run on every rank before any communication.

A mixer is anything with `start()` (begin one averaging step of the parameters;
they must not change until `finish()`) and `finish()` (complete it in place).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from commbench.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from commbench.optimizers.base import TrainStep
    from commbench.topology import Schedule


def combine_step(model, optimizer, mixer, atc: bool) -> "TrainStep":
    """The training step of a strategy that averages parameters with `mixer` (W).

    AWC (adapt-with-combine, default): x' = W x - lr g(x). The parameters start
    travelling right after the forward pass and arrive while backward runs; the
    local step then applies the gradient taken at the old x to the averaged x.
    ATC (adapt-then-combine): x' = W (x - lr g(x)): the local step first, then the
    exchange, which has nothing left to overlap with.
    """
    import torch.nn.functional as F

    def adapt_with_combine(images, labels):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        mixer.start()  # backward only reads the parameters, so they can be sent meanwhile
        loss.backward()
        mixer.finish()
        optimizer.step()
        return loss

    def adapt_then_combine(images, labels):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        mixer.start()
        mixer.finish()
        return loss

    return adapt_then_combine if atc else adapt_with_combine


def checked_schedule(topology: str, size: int, dynamic: bool,
                     machine_size: Optional[int] = None) -> "Schedule":
    """build_schedule, with its errors worded as errors of the --topology flag."""
    from commbench.topology import TopologyError, build_schedule

    try:
        return build_schedule(topology, size, dynamic, machine_size)
    except TopologyError as e:
        raise UsageError(f"argument --topology: {e}") from None


def check_machine_size(machine_size: Optional[int], world_size: int) -> None:
    """--machine-size must split the ranks into equal machines (checked before init)."""
    if machine_size is not None and world_size % machine_size:
        raise UsageError(f"argument --machine-size: {machine_size} does not divide the "
                         f"{world_size} ranks into equal machines")


def check_cpu_transport(choice: str, launch) -> None:
    """--cpu-transport mpi without an MPI launcher (before init; whether mpi4py was set
    up shows only after the rendezvous: NeighborExchange's choose_transport)."""
    from commbench.optimizers.neighbor_exchange import MPI_UNAVAILABLE

    if choice == "mpi" and not launch.mpi:
        raise UsageError(MPI_UNAVAILABLE)


def style(atc: bool) -> str:
    return "atc" if atc else "awc"


def mixing_facts(config, ctx, schedule: "Schedule", nodes: int,
                 transport: str) -> Dict[str, Any]:
    """What a result records of a parameter-averaging strategy; `nodes` is the size
    of the graph that W mixes (ranks, or machines for the hierarchical strategy);
    `transport` carries the neighbor exchange (mpi, gloo or nccl)."""
    from commbench.topology import build_topology

    return {
        "topology": config.topology,
        "dynamic": schedule.dynamic,
        "schedule": schedule.kind,
        "schedule_period": schedule.period,
        "style": style(config.atc_style),
        "fp16": config.fp16_allreduce,
        "transport": transport,
        "spectral_gap": build_topology(config.topology, nodes).spectral_gap,
        "machine_size": ctx.machine_size,
        "num_machines": ctx.num_machines,
        "simulated_machines": ctx.simulated_machines,
    }
