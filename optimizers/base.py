"""The shape of a distributed-optimizer plugin.

A plugin is a class with a few class attributes (what it is called, what it
needs) and one job: turn a model and a local optimizer into a training step that
communicates the way the strategy prescribes. The timed loop calls that step and
knows nothing else about the strategy. Heavy imports (horovod, bluefog) belong
inside `wrap`, so that `commbench list` works everywhere.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Optional, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from commbench.config import RunConfig
    from commbench.launch.distributed import DistContext
    from commbench.launch.environment import LaunchInfo

# (images, labels) -> loss of this batch; one forward, backward, exchange and update.
TrainStep = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


class Strategy:
    """Base class of every `--dist-optimizer` plugin."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # Top-level modules that must be importable for the plugin to run here.
    requires: ClassVar[Tuple[str, ...]] = ()
    # Decentralized strategies let workers' models differ; the loop then records
    # the consensus distance of the parameters after every iteration.
    decentralized: ClassVar[bool] = False

    @classmethod
    def unusable_reason(cls) -> Optional[str]:
        """Why this plugin cannot run here, or None when it can."""
        missing = [m for m in cls.requires if importlib.util.find_spec(m) is None]
        return f"needs {', '.join(missing)}, which is not installed" if missing else None

    @classmethod
    def check(cls, config: "RunConfig", launch: "LaunchInfo") -> None:
        """Raise UsageError for a configuration the strategy cannot run.

        Called on every rank before any communication, so a bad request ends all
        ranks with the same one-line error instead of a hang.
        """

    def __init__(self, ctx: "DistContext", config: "RunConfig"):
        self.ctx = ctx
        self.config = config

    def wrap(self, model: "torch.nn.Module", optimizer: "torch.optim.Optimizer") -> TrainStep:
        """Return the training step; called once, after the process group is up."""
        raise NotImplementedError

    def facts(self) -> Dict[str, Any]:
        """What the result file should record about this strategy (e.g. its topology)."""
        return {}


def local_step(model, optimizer) -> TrainStep:
    """A training step with no communication at all."""
    import torch.nn.functional as F

    def step(images, labels):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    return step
