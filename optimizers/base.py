"""The shape of a distributed-optimizer plugin (`--dist-optimizer NAME`).

A plugin is a class with a few class attributes (what it is called, what it needs,
its own flags) and one job: turn a model and a local optimizer into a training step
that communicates the way the strategy prescribes. The timed loop calls that step
and knows nothing else about the strategy. Heavy imports (horovod, bluefog) belong
inside `wrap`, so that `commbench list` works everywhere.

A run flag that means something to some strategies only (the topology settings) is
refused, in one line, when given to a strategy that would ignore it: recorded, it would
look as if it had acted. A plugin that reads them sets `uses_topology`.

The training steps every plugin can take (`local_step`, `waiting_step`) record their
phases and waits for the step split. Strategies that average parameters along a
mixing matrix W derive from commbench.optimizers.mixing's `MixingStrategy`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Optional, Tuple, Type

from commbench import spans
from commbench.errors import UsageError
from commbench.flags import option_name

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from commbench.config import RunConfig
    from commbench.launch.detect import LaunchInfo
    from commbench.launch.distributed import DistContext

# (images, labels) -> loss of this batch; one forward, backward, exchange and update.
TrainStep = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]

# The RunConfig fields that only strategies averaging along a graph read.
TOPOLOGY_FLAGS = ("topology", "disable_dynamic_topology", "atc_style")


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
    # True when the strategy averages along a graph and so reads TOPOLOGY_FLAGS.
    uses_topology: ClassVar[bool] = False

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
        if not config.shared_by_plugins:
            cls.refuse_flags_it_ignores(config)

    @classmethod
    def ignored_flags(cls) -> Tuple[str, ...]:
        """The RunConfig fields whose flags mean nothing to this strategy."""
        return () if cls.uses_topology else TOPOLOGY_FLAGS

    @classmethod
    def refuse_flags_it_ignores(cls, config: "RunConfig") -> None:
        """Raise UsageError for a flag this strategy ignores that was given a value other
        than its default (argparse leaves no other trace of what the user typed)."""
        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        for name in cls.ignored_flags():
            if getattr(config, name) != defaults[name]:
                raise UsageError(f"argument {option_name(name)}: means nothing to {cls.name}, "
                                 "which averages along no topology; leave it out (`commbench "
                                 "list` names the strategies that have one)")

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
