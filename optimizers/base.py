"""The shape of a distributed-optimizer plugin (`--dist-optimizer NAME`).

A plugin is a class with a few class attributes (what it is called, what it needs,
its own flags) and one job: turn a model and a local optimizer into a training step
that communicates the way the strategy prescribes. The timed loop calls that step
and knows nothing else about the strategy. Heavy imports (horovod, bluefog) belong
inside `wrap`, so that `commbench list` works everywhere.

A strategy reads the flags of the job's sections, its own Options, and the strategy
sections it declares in `sections` (commbench.config.run_config.STRATEGY_SECTIONS: the
topology, the machines, the compression); `unread` names every other flag, and a flag
given that the strategy does not read is refused in one line (commbench.registry.
refuse_unread): recorded, it would look as if it had acted. A strategy that compresses
its messages lists the kinds it can send in `compressions`.

`wrap` returns commbench.job.training_step's `TrainingStep` (or a function around one),
given what the strategy does at the step's points (after forward, before and after the
update); the step records its phases and waits for the step split. Strategies that
average parameters along a mixing matrix W derive from commbench.optimizers.mixing's
`MixingStrategy`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Optional, Tuple, Type

from commbench.config import compression
from commbench.config.compression import CompressionFlags
from commbench.config.sections import Section
from commbench.errors import UsageError
from commbench.launch.groups import MachineFlags
from commbench.topology.schedules import TopologyFlags

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from commbench.config.run_config import RunConfig
    from commbench.faults.recovery_hook import Recovery
    from commbench.launch.detect import LaunchInfo
    from commbench.launch.distributed import DistContext

# The sections only some strategies read, each declared by the ones that do.
STRATEGY_SECTIONS = (TopologyFlags, MachineFlags, CompressionFlags)

# (images, labels) -> loss of this batch; one forward, backward, exchange and update.
TrainStep = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


@dataclass(frozen=True)
class NoOptions:
    """A plugin's own flags: a frozen dataclass whose fields are declared with
    commbench.config.flags.flag(default, help, check), like RunConfig's. `commbench run`
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
    # False when an engine fuses what it is handed into messages of its own, out of
    # sight: its results give the bytes on the wire but no count of messages.
    counts_messages: ClassVar[bool] = True
    # False for a strategy that sends nothing (`none`). Any other that records no bytes
    # on the wire in a job of several workers is flagged (summary.wire_unrecorded): it
    # communicated where commbench did not count it (commbench.comm.collectives counts).
    communicates: ClassVar[bool] = True
    # True when a worker's model and optimizer are all the strategy carries from one
    # step to the next, so that a checkpoint of them resumes it exactly (--recovery
    # restart, commbench.faults.recovery); a strategy with state of its own (a step count,
    # an outer optimizer, a schedule's position) is refused.
    restartable: ClassVar[bool] = False

    @property
    def sees_wire(self) -> bool:
        """Whether the recorded pieces tell what this run put on the wire."""
        return type(self).records_split
    # The strategy sections whose flags this strategy reads (see the module's doc).
    sections: ClassVar[Tuple[Type[Section], ...]] = ()
    # The --compression kinds the strategy can send (commbench.config.compression.KINDS);
    # a strategy that sends some reads the CompressionFlags section.
    compressions: ClassVar[Tuple[str, ...]] = ()

    def own_recovery(self) -> Optional["Recovery"]:
        """The recovery policy this strategy carries itself, or None: gossip's survivors
        live in neighbor_allreduce's exchange (commbench.faults.gossip_recovery)."""
        return None

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
        cls.check_flags(config)
        if (config.machine_size is not None and MachineFlags in cls.reads()
                and launch.world_size % config.machine_size):
            raise UsageError(f"argument --machine-size: {config.machine_size} does not divide "
                             f"the {launch.world_size} ranks into equal machines")

    @classmethod
    def check_training_steps(cls, config: "RunConfig", steps: int, bound: str) -> None:
        """Raise UsageError where a run trained to accuracy, bounded to `steps` steps by
        `bound` (the flags that say so), would end before the strategy has acted. Called
        on every rank alike once the steps of an epoch are known."""

    @classmethod
    def check_flags(cls, config: "RunConfig") -> None:
        """The checks of check() that need the flags alone, not the launch: `commbench
        simulate` makes them of every strategy it projects, so that it never projects
        what `commbench run` refuses."""
        if cls.compressions:
            compression.check(config, cls.name, cls.compressions)

    @classmethod
    def reads(cls) -> Tuple[Type[Section], ...]:
        """The strategy sections this strategy reads."""
        return cls.sections + ((CompressionFlags,) if cls.compressions else ())

    @classmethod
    def unread(cls, config: "RunConfig", launch: Optional["LaunchInfo"] = None
               ) -> Dict[str, str]:
        """The run flags this strategy does not read, each with why (said after "argument
        --flag: "): those of every strategy section it does not declare. An override adds
        those its own settings make moot (given the launch where it is known); the
        registry adds the other plugins' options (commbench.registry.refuse_unread)."""
        return {name: f"means nothing to {cls.name}, which {section.ignored_because}"
                for section in STRATEGY_SECTIONS if section not in cls.reads()
                for name in section.names()}

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
        """Return the training step (a commbench.job.training_step.TrainingStep with this
        strategy's actions at its points); called once, after the process group is up."""
        raise NotImplementedError

    def settle(self) -> None:
        """Called between steps before commbench's own collectives (after each timed
        iteration, before each evaluation). A strategy whose messages complete only
        when their targets enter its library (one-sided puts over TCP) lets them
        complete here, so that no rank waits in one library on a peer waiting in
        another."""

    def facts(self) -> Dict[str, Any]:
        """What the result file should record about this strategy (e.g. its topology)."""
        return {}

