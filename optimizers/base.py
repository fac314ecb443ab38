"""The shape of a distributed-optimizer plugin (`--dist-optimizer NAME`).

A plugin is a class with a few class attributes (what it is called, what it needs,
its own flags) and one job: turn a model and a local optimizer into a training step
that communicates the way the strategy prescribes. The timed loop calls that step
and knows nothing else about the strategy. Heavy imports (horovod, bluefog) belong
inside `wrap`, so that `commbench list` works everywhere.

Strategies that average parameters along a mixing matrix W derive from
`MixingStrategy`, which holds what they share: the topology schedule, the mixer that
runs one averaging step, the AWC/ATC training step around it, and their checks.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, List, Optional, Tuple, Type

from commbench import spans
from commbench.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from commbench.config import RunConfig
    from commbench.launch.detect import LaunchInfo
    from commbench.launch.distributed import DistContext
    from commbench.topology import Schedule

# (images, labels) -> loss of this batch; one forward, backward, exchange and update.
TrainStep = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


@dataclass(frozen=True)
class NoOptions:
    """A plugin's own flags: a frozen dataclass whose fields are declared with
    commbench.flags.flag(default, help, check), like RunConfig's. `commbench run`
    offers them as flags, `commbench list` shows them, results record them in
    their config beside the other flags."""


class Strategy:
    """Base class of every `--dist-optimizer` plugin."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # Top-level modules that must be importable for the plugin to run here.
    requires: ClassVar[Tuple[str, ...]] = ()
    # True when workers' models may differ (nothing forces them equal): the loop then
    # records the consensus distance of the parameters after every iteration.
    decentralized: ClassVar[bool] = False
    Options: ClassVar[Type[Any]] = NoOptions
    # False when the strategy communicates where commbench's spans cannot see it (inside
    # an engine's own step): its steps then get no split rather than a wrong one.
    records_split: ClassVar[bool] = True

    @classmethod
    def unusable_reason(cls) -> Optional[str]:
        """Why this plugin cannot run here, or None when it can."""
        missing = [m for m in cls.requires if importlib.util.find_spec(m) is None]
        return f"needs {', '.join(missing)}, which is not installed" if missing else None

    @classmethod
    def check(cls, config: "RunConfig", launch: "LaunchInfo") -> None:
        """Raise UsageError for a configuration the strategy cannot run.

        Called on every rank before any communication, so a bad request ends all
        ranks with the same one-line error instead of a hang. Overrides call
        super().check() first.
        """

    @classmethod
    def options_of(cls, config: "RunConfig") -> Any:
        """This plugin's Options with the values of config (defaults where absent)."""
        known = {f.name for f in fields(cls.Options)}
        return cls.Options(**{k: v for k, v in config.options.items() if k in known})

    def __init__(self, ctx: "DistContext", config: "RunConfig"):
        self.ctx = ctx
        self.config = config
        self.options = self.options_of(config)

    def wrap(self, model: "torch.nn.Module", optimizer: "torch.optim.Optimizer") -> TrainStep:
        """Return the training step; called once, after the process group is up."""
        raise NotImplementedError

    def facts(self) -> Dict[str, Any]:
        """What the result file should record about this strategy (e.g. its topology)."""
        return {}


def local_step(model, optimizer, waits_after_last_piece: bool = False) -> TrainStep:
    """A training step with no communication of its own, recording its phases (the
    model may communicate inside them: DDP, Horovod). With waits_after_last_piece,
    backward's tail after the step's last communication piece was posted is a wait
    for communication, not compute: DDP hands its last bucket over when the gradients
    are complete and then only waits for the averages."""
    import torch.nn.functional as F

    def step(images, labels):
        optimizer.zero_grad()
        t0 = spans.now()
        loss = F.cross_entropy(model(images), labels)
        t1 = spans.now()
        loss.backward()
        t2 = spans.now()
        optimizer.step()
        t3 = spans.now()
        spans.record("forward", t0, t1)
        spans.record("backward", t1, t2)
        posted = spans.last_post() if waits_after_last_piece else None
        if posted is not None and t1 < posted < t2:
            spans.record("wait", posted, t2)
        spans.record("optimizer", t2, t3)
        return loss

    return step


def waiting_step(model, optimizer, wait: Callable[[], None],
                 update: Optional[Callable[[], None]] = None) -> TrainStep:
    """A training step whose communication is awaited between backward and the update:
    `wait` blocks until the gradients are averaged (recorded as a wait), then `update`
    (default: optimizer.step) applies them."""
    import torch.nn.functional as F

    update = update or optimizer.step

    def step(images, labels):
        optimizer.zero_grad()
        t0 = spans.now()
        loss = F.cross_entropy(model(images), labels)
        t1 = spans.now()
        loss.backward()
        t2 = spans.now()
        wait()
        t3 = spans.now()
        update()
        t4 = spans.now()
        for kind, start, end in (("forward", t0, t1), ("backward", t1, t2), ("wait", t2, t3),
                                 ("optimizer", t3, t4)):
            spans.record(kind, start, end)
        return loss

    return step


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


class MixingStrategy(Strategy):
    """A strategy that averages parameters along W of --topology (static, or a
    dynamic schedule), around the local gradient step: AWC by default, ATC with
    --atc-style. The graph's nodes are ranks, or machines for hierarchical ones.

    After wrap(), `mixer` runs one averaging step as the training step does and
    `schedule` says which W applies at each step (commbench microbench times both).
    """

    decentralized = True
    mixer: Optional[Mixer] = None

    @classmethod
    def nodes_before_init(cls, config: "RunConfig", launch: "LaunchInfo") -> int:
        """How many nodes W will have, as far as the launcher's variables tell."""
        return launch.world_size

    @classmethod
    def check(cls, config, launch) -> None:
        super().check(config, launch)
        if config.machine_size is not None and launch.world_size % config.machine_size:
            raise UsageError(f"argument --machine-size: {config.machine_size} does not divide "
                             f"the {launch.world_size} ranks into equal machines")
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

        self.mixer = self.build_mixer(fuse_parameters(model))
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
    import torch.nn.functional as F

    def post(at: float):
        """The averaging step as a communication piece (asked of the mixer only while
        recording: its peers come from the schedule)."""
        nbytes = mixer.piece_bytes() if spans.RECORDER.on else 0
        if not nbytes:  # not recording, or a step that sends nothing (one node)
            return None
        return spans.record("comm", at, None, "neighbor averaging", nbytes, mixer.peers())

    def adapt_with_combine(images, labels):
        optimizer.zero_grad()
        t0 = spans.now()
        loss = F.cross_entropy(model(images), labels)
        t1 = spans.now()
        piece = post(t1)
        mixer.start()  # backward only reads the parameters, so they can be sent meanwhile
        t2 = spans.now()
        loss.backward()
        t3 = spans.now()
        mixer.finish()
        t4 = spans.now()
        spans.close(piece)
        optimizer.step()
        t5 = spans.now()
        spans.record("forward", t0, t1)
        spans.record("post", t1, t2)
        spans.record("backward", t2, t3)
        spans.record("wait", t3, t4)
        spans.record("optimizer", t4, t5)
        return loss

    def adapt_then_combine(images, labels):
        optimizer.zero_grad()
        t0 = spans.now()
        loss = F.cross_entropy(model(images), labels)
        t1 = spans.now()
        loss.backward()
        t2 = spans.now()
        optimizer.step()
        t3 = spans.now()
        piece = post(t3)
        mixer.start()
        mixer.finish()
        spans.close(piece)
        spans.record("forward", t0, t1)
        spans.record("backward", t1, t2)
        spans.record("optimizer", t2, t3)
        spans.record("wait", t3, piece[3] if piece else t3)
        return loss

    return adapt_then_combine if atc else adapt_with_combine


def checked_schedule(topology: str, size: int, dynamic: bool,
                     machine_size: Optional[int] = None) -> "Schedule":
    """topology.build_schedule, its errors worded as errors of the --topology flag."""
    from commbench.topology import TopologyError, build_schedule

    try:
        return build_schedule(topology, size, dynamic, machine_size)
    except TopologyError as e:
        raise UsageError(f"argument --topology: {e}") from None
