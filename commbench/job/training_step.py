"""The one training step: a batch through forward and loss, backward and the update,
each phase recorded as a span for the step split and the timeline, with the points
where a strategy acts. Every strategy and the compute-only reference take this step; a
strategy states what it does at its points and never writes the step again.

The points, in the order a step reaches them:

- after_forward: the parameters are final for this step and backward only reads them,
  so communication started here overlaps backward; its time is recorded as "post"
  (what handing the work over costs the step);
- before_update: the gradients are complete; its time is recorded as "wait" (blocked
  on communication, e.g. averaged gradients);
- after_update: the parameters are updated; its time is recorded as "wait".

Each is called with the clock reading (`spans.now()`) at which its span starts, so a
communication piece it posts there starts exactly where the step's time for it does.

On a rank slowed on purpose (--slow-ranks, commbench.job.straggler) each compute phase is
preceded by the idling it is given, recorded as an "injected" phase. The step owns its
straggler: a plugin builds its step knowing nothing of stragglers, so the job builds
the strategy's steps inside `slowed_by`, and each step takes the straggler then.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Iterator, List, NamedTuple, Optional

from commbench.timing import spans

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from commbench.job.straggler import Straggler

# A strategy's action at one point of the step, given when its span starts.
Hook = Callable[[float], None]


class Phase(NamedTuple):
    """One recorded phase of the last step: its span's kind and clock readings."""

    kind: str
    start: float
    end: float


# The straggler of the steps being built (slowed_by); read once, by each step's __init__.
_BUILDING_FOR: Optional["Straggler"] = None


@contextlib.contextmanager
def slowed_by(straggler: Optional["Straggler"]) -> Iterator[None]:
    """The steps built in this block (a strategy's `wrap`) idle as the straggler says."""
    global _BUILDING_FOR
    _BUILDING_FOR = straggler
    try:
        yield
    finally:
        _BUILDING_FOR = None


class TrainingStep:
    """`step(images, labels)` trains on one batch and returns its loss.

    update replaces optimizer.step() where the strategy's optimizer must be stepped its
    own way. With waits_after_last_piece, backward's tail after the step's last
    communication piece was posted is a wait, not compute: DDP hands its last bucket
    over when the gradients are complete and then only waits for the averages. With
    sync, every phase ends with it (a device sync), so the phases are the device's and
    not the launch queue's; `phases` holds the last step's phases in order. `straggler`
    is this rank's slowdown, the one of the block it was built in (slowed_by); with
    slowed False it has none (the compute-only reference measures the machine's own
    speed).
    """

    def __init__(self, model: "torch.nn.Module", optimizer: "torch.optim.Optimizer",
                 after_forward: Optional[Hook] = None, before_update: Optional[Hook] = None,
                 after_update: Optional[Hook] = None,
                 update: Optional[Callable[[], None]] = None,
                 waits_after_last_piece: bool = False,
                 sync: Optional[Callable[[], None]] = None, slowed: bool = True):
        # imported here: `commbench list` and `--help` load no torch
        from torch.nn.functional import cross_entropy

        self.model, self.optimizer = model, optimizer
        self.after_forward, self.before_update = after_forward, before_update
        self.after_update, self.update = after_update, update
        self.waits_after_last_piece, self.sync = waits_after_last_piece, sync
        self.straggler = _BUILDING_FOR if slowed else None
        self.cross_entropy = cross_entropy
        self.phases: List[Phase] = []

    def __call__(self, images: "torch.Tensor", labels: "torch.Tensor") -> "torch.Tensor":
        self.phases = []
        slow = self.straggler
        if slow is not None:
            slow.begin_step()
        self.optimizer.zero_grad()
        start = self._idle(slow, "forward", spans.now())
        loss = self.cross_entropy(self.model(images), labels)
        start = self._end("forward", start)
        if self.after_forward is not None:
            self.after_forward(start)
            start = self._end("post", start)
        start = self._idle(slow, "backward", start)
        loss.backward()
        start = self._end("backward", start)
        if self.before_update is not None:
            self.before_update(start)
            start = self._end("wait", start)
        start = self._idle(slow, "optimizer", start)
        (self.update or self.optimizer.step)()
        self._end("optimizer", start)
        self._record(self.phases)
        if self.after_update is not None:
            # Recorded after the other phases, so that a piece it posts follows them.
            start = spans.now()
            self.after_update(start)
            self._end("wait", start)
            self._record(self.phases[-1:])
        return loss

    def _idle(self, slow: Optional["Straggler"], phase: str, start: float) -> float:
        """A slowed rank's idling before a compute phase; returns when it ended."""
        seconds = slow.seconds(phase) if slow is not None else 0.0
        if seconds <= 0.0:
            return start
        slow.idle(seconds)
        return self._end("injected", start)

    def _end(self, kind: str, start: float) -> float:
        """End the phase begun at start; returns the clock reading that ends it."""
        if self.sync is not None:
            self.sync()
        end = spans.now()
        self.phases.append(Phase(kind, start, end))
        return end

    def _record(self, phases: List[Phase]) -> None:
        for phase in phases:
            spans.record(phase.kind, phase.start, phase.end)
            if phase.kind == "backward" and self.waits_after_last_piece:
                posted = spans.last_post()
                if posted is not None and phase.start < posted < phase.end:
                    spans.record("wait", posted, phase.end)


def summed_loss(outputs: "torch.Tensor", labels: "torch.Tensor") -> float:
    """The step's loss summed over the batch instead of averaged: what evaluation adds up
    over a validation set, so that the loss is defined here alone."""
    from torch.nn.functional import cross_entropy

    return float(cross_entropy(outputs, labels, reduction="sum"))
