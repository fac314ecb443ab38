"""A compressing DDP comm hook seen from inside: the process group it is handed records
every collective the hook issues on it, and the hook's own work between them.

torch's compression hooks (fp16/bf16_compress_hook, powerSGD_hook) issue one or several
allreduces per bucket, of tensors whose size and type only they know, and compute in
between: cast, orthogonalize, multiply, cast back. Each call of the hook gets a
`WatchedGroup` of its own around the real group, so its collectives form one chain in
time, hook start -> allreduce -> its completion -> ... -> the hook's result. Each
allreduce is a communication piece with the bytes it actually carried; each stretch
between is codec time, the price of the compression (commbench.timing.step_split).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from commbench.timing import spans, wire


class WatchedGroup:
    """The process group one hook call uses; any other attribute is the real group's."""

    def __init__(self, group: Any, ranks: int):
        self._group = group
        self._ranks = ranks
        self._working_since: Optional[float] = spans.now()  # the hook's own work
        # DDP calls the hook on the thread running backward (the step's on the CPU, the
        # autograd engine's device thread on a GPU); what is not on it is a callback's.
        self._hook_thread = threading.get_ident()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)

    def size(self) -> int:
        return self._ranks

    def allreduce(self, tensors, opts):
        """torch.distributed.all_reduce's call: a piece from here to its completion."""
        self._codec_until(spans.now())
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        piece = spans.record("comm", spans.now(), None, f"allreduce {tensors[0].dtype}"
                             .replace("torch.", ""), nbytes,
                             sent=wire.ring_allreduce(nbytes, self._ranks),
                             aside=not self._on_hook_thread())
        return _WatchedWork(self._group.allreduce(tensors, opts), self, piece)

    def completed(self, piece) -> None:
        spans.close(piece)
        self._working_since = spans.now()

    def done(self) -> None:
        """The hook's result is ready: its last stretch of work ends."""
        self._codec_until(spans.now())

    def _codec_until(self, end: float) -> None:
        if self._working_since is not None:
            # The hook itself runs inside backward; what follows a completed allreduce
            # runs in its callback, on the transport's thread.
            kind = "codec" if self._on_hook_thread() else "codec-callback"
            spans.record(kind, self._working_since, end)
            self._working_since = None

    def _on_hook_thread(self) -> bool:
        return threading.get_ident() == self._hook_thread


class _WatchedWork:
    """The collective's Work; its future completes after the piece is closed."""

    def __init__(self, work, group: WatchedGroup, piece):
        self._work, self._group, self._piece = work, group, piece

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)

    def get_future(self):
        def closed(fut):
            self._group.completed(self._piece)
            return fut.value()

        return self._work.get_future().then(closed)

    def wait(self, *args) -> bool:
        done = self._work.wait(*args)
        self._group.completed(self._piece)
        return done


def watched(hook, state_of, ranks: int, group_of=None):
    """DDP's comm hook `hook`, called with a state that carries a fresh WatchedGroup each
    time: state_of(group) is that state (the group itself for torch's default hooks, the
    PowerSGD state with its process_group set for powerSGD_hook). group_of(bucket) is
    the process group the bucket's collectives go to (default: every rank's)."""
    import torch.distributed as dist

    def watched_hook(_, bucket):
        group = group_of(bucket) if group_of else dist.group.WORLD
        if not spans.recording():
            return hook(state_of(group), bucket)
        seen = WatchedGroup(group, ranks)
        future = hook(state_of(seen), bucket)

        def completed(fut):
            seen.done()
            return fut.value()

        return future.then(completed)

    return watched_hook


class GroupPerBucket:
    """A process group of every rank for each of DDP's buckets, made the first time the
    bucket is seen (in bucket order, the same on every rank).

    A hook that issues its next allreduce from the callback of the last (PowerSGD)
    issues them, over gloo, from the transport's threads in whatever order buckets
    complete, which differs between ranks: on one group the ranks' collectives would
    then mismatch. Each bucket's chain is strictly sequential, so on a group of its own
    every rank issues the same collectives in the same order."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.groups = {}

    def __call__(self, bucket):
        import torch.distributed as dist

        index = bucket.index()
        if index not in self.groups:
            self.groups[index] = dist.new_group(list(range(self.ranks)))
        return self.groups[index]
