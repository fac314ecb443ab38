"""Counted collectives for plugins: torch.distributed's allreduce and broadcast, each
call recorded as one communication piece (a span for the step split and the timeline)
with what this rank puts on the wire for it (commbench.timing.wire). A plugin that
communicates through these gets its bytes on the wire without counting them itself
(docs/plugins.md); one that calls torch.distributed directly records none, and its
result says so (`summary.wire_unrecorded`).

Each call blocks until its tensors hold the result. `started` is the clock reading a
step's point was called with (commbench.job.training_step), so that the piece starts where
the step's time for it does; None starts it now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, List, Optional

from commbench.timing import spans, wire
from commbench.timing.wire import NOTHING, Sent

if TYPE_CHECKING:  # pragma: no cover
    import torch


def all_reduce(tensors: Iterable["torch.Tensor"], started: Optional[float] = None,
               name: str = "allreduce", average: bool = True, group: Any = None) -> None:
    """Sum each tensor over the group's ranks in place (average: then divide by their
    number), one allreduce per tensor, sent as a ring allreduce (gloo's and NCCL's
    algorithm for large buffers)."""
    import torch.distributed as dist

    views = [t.detach() for t in tensors]  # parameters too: no autograd in place
    ranks = dist.get_world_size(group)
    sent = _total(wire.ring_allreduce(_size(v), ranks) for v in views)
    piece = _piece(started, name, views, sent)
    for view in views:
        dist.all_reduce(view, group=group)
        if average:
            view.div_(ranks)
    spans.close(piece)


def broadcast(tensors: Iterable["torch.Tensor"], root: int = 0,
              started: Optional[float] = None, name: str = "broadcast",
              group: Any = None) -> None:
    """Each tensor from rank root (its global rank) to every rank of the group, in place;
    only the root sends, once to each other rank."""
    import torch.distributed as dist

    views = [t.detach() for t in tensors]
    ranks, mine = dist.get_world_size(group), dist.get_rank() == root
    sent = _total(wire.broadcast(_size(v), ranks, mine) for v in views)
    piece = _piece(started, name, views, sent)
    for view in views:
        dist.broadcast(view, root, group=group)
    spans.close(piece)


def _piece(started: Optional[float], name: str, views: List["torch.Tensor"],
           sent: Sent) -> Optional[spans.Span]:
    start = spans.now() if started is None else started
    return spans.record("comm", start, None, name, sum(_size(v) for v in views), sent=sent)


def _size(tensor: "torch.Tensor") -> int:
    return tensor.numel() * tensor.element_size()


def _total(sends: Iterable[Sent]) -> Sent:
    return sum(sends, NOTHING)
