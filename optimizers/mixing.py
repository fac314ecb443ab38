"""What the strategies that average parameters along a mixing matrix W share: the
topology schedule (`MixingStrategy`), the mixer that runs one averaging step
(`Mixer`), the AWC/ATC training step around it (`combine_step`, with the mixer's
`Averaging` at the step's points), and their checks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from commbench.launch.groups import MachineFlags
from commbench.timing import spans
from commbench.topology.schedules import TopologyFlags
from commbench.errors import UsageError
from commbench.optimizers.base import Strategy, TrainStep
from commbench.job.training_step import TrainingStep
from commbench.timing.wire import NOTHING, Sent

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from commbench.config.run_config import RunConfig
    from commbench.launch.detect import LaunchInfo
    from commbench.topology import Schedule


class Mixer:
    """One averaging step of the parameters, x <- (W x) in place, in two halves:
    start() begins it (the parameters must not change until finish()), finish()
    completes it. commbench.comm's NeighborExchange and MachineAveraging are mixers."""

    def start(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        raise NotImplementedError

    def peers(self) -> Optional[List[int]]:
        """The ranks whose pieces the next averaging step waits for (None: all)."""
        return None

    def piece_bytes(self) -> int:
        """Bytes of parameters one averaging step carries (timeline labels)."""
        return 0

    def wire(self) -> Sent:
        """What this rank puts on the wire in the next averaging step."""
        return NOTHING

    def moves_alone(self) -> bool:
        """Whether its messages move while this rank computes (False: only while it
        waits in finish(), as MPI's point-to-point messages do)."""
        return True


class MixingStrategy(Strategy):
    """A strategy that averages parameters along W of --topology (static, or a
    dynamic schedule), around the local gradient step: AWC by default, ATC with
    --atc-style. The graph's nodes are ranks, or machines for hierarchical ones.

    After wrap(), `mixer` runs one averaging step as the training step does and
    `schedule` says which W applies at each step (commbench microbench times both).
    """

    decentralized = True
    sections = (TopologyFlags, MachineFlags)
    mixer: Optional[Mixer] = None

    @classmethod
    def nodes_before_init(cls, config: "RunConfig", launch: "LaunchInfo") -> int:
        """How many nodes W will have, as far as the launcher's variables tell."""
        return launch.world_size

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        # Every error of the topology itself shows here, before any communication.
        checked_schedule(config.topology, cls.nodes_before_init(config, launch),
                         not config.disable_dynamic_topology)

    def __init__(self, ctx, config):
        super().__init__(ctx, config)
        self.schedule: "Schedule" = checked_schedule(
            config.topology, self.nodes(), not config.disable_dynamic_topology,
            self.schedule_machine_size())

    def nodes(self) -> int:
        """Size of the graph W mixes."""
        return self.ctx.world_size

    def node(self) -> int:
        """This process's node in that graph."""
        return self.ctx.rank

    def schedule_machine_size(self) -> Optional[int]:
        """Ranks per machine when the nodes are ranks on several equal machines (real
        or simulated): the dynamic schedule is then Bluefog's inner-outer machine
        schedule, as Bluefog's benchmark chooses it."""
        equal = self.ctx.machine_size > 0
        return self.ctx.machine_size if equal and self.ctx.num_machines > 1 else None

    def build_mixer(self, buffers: List["torch.Tensor"]) -> Mixer:
        """The mixer over the model's flat parameter buffers."""
        raise NotImplementedError

    def wrap(self, model, optimizer) -> TrainStep:
        from commbench.comm.fused import fuse_parameters

        buffers = fuse_parameters(model)
        self.mixer = self.build_mixer(buffers)
        kept = getattr(self.mixer, "buffers", buffers)
        if any(a is not b for a, b in zip(kept, buffers)):  # the mixer keeps them elsewhere
            fuse_parameters(model, into=kept)
        return combine_step(model, optimizer, self.mixer, self.config.atc_style)

    def facts(self) -> Dict[str, Any]:
        return {"topology": self.config.topology, "dynamic": self.schedule.dynamic,
                "schedule": self.schedule.kind, "schedule_period": self.schedule.period,
                "style": "atc" if self.config.atc_style else "awc"}


def combine_step(model, optimizer, mixer: Mixer, atc: bool) -> TrainStep:
    """The training step of a strategy that averages parameters with `mixer` (W).

    AWC (adapt-with-combine, default): x' = W x - lr g(x). The parameters start
    travelling right after the forward pass and arrive while backward runs; the
    local step then applies the gradient taken at the old x to the averaged x.
    ATC (adapt-then-combine): x' = W (x - lr g(x)): the local step first, then the
    exchange, which has nothing left to overlap with.
    """
    averaging = Averaging(mixer)
    if atc:
        return TrainingStep(model, optimizer, after_update=averaging.run)

    def update() -> None:
        averaging.close()  # the piece ends as the wait for it did, where the update begins
        optimizer.step()

    # backward only reads the parameters, so they can be sent meanwhile
    return TrainingStep(model, optimizer, after_forward=averaging.start,
                        before_update=averaging.complete, update=update)


class Averaging:
    """The mixer's averaging step at a training step's points, recorded as one
    communication piece from its start to its completion."""

    def __init__(self, mixer: Mixer):
        self.mixer = mixer
        self.piece: Optional[spans.Span] = None

    def start(self, at: float) -> None:
        self.piece = self.post(at)
        self.mixer.start()

    def complete(self, at: float) -> None:
        self.mixer.finish()

    def close(self) -> None:
        spans.close(self.piece)

    def run(self, at: float) -> None:
        """The whole averaging step, with nothing to overlap."""
        self.start(at)
        self.complete(at)
        self.close()

    def post(self, at: float):
        """The averaging step as a communication piece (asked of the mixer only while
        recording: its peers come from the schedule)."""
        nbytes = self.mixer.piece_bytes() if spans.recording() else 0
        if not nbytes:  # not recording, or a step that sends nothing (one node)
            return None
        return spans.record("comm", at, None, "neighbor averaging", nbytes,
                            self.mixer.peers(), self.mixer.wire(),
                            moves_alone=self.mixer.moves_alone())


def checked_schedule(topology: str, size: int, dynamic: bool,
                     machine_size: Optional[int] = None) -> "Schedule":
    """topology.build_schedule, its errors worded as errors of the --topology flag."""
    from commbench.topology import TopologyError, build_schedule

    try:
        return build_schedule(topology, size, dynamic, machine_size)
    except TopologyError as e:
        raise UsageError(f"argument --topology: {e}") from None
