"""The spans each rank records over the measured steps: what a step's time went to,
as typed records (`Span`) that one recorder per measurement collects.

Kinds of span: step; forward, backward, optimizer (compute); comm (a piece, from its
posting to its completion, with its bytes, the ranks it involves, and what this rank
put on the wire for it); post (the
critical path's cost of handing a piece over); wait (blocked on pieces); codec
(compressing or decompressing messages on the step's own thread) and codec-callback (the
same in a communication callback, on the transport's thread); handed (a tensor handed
to an engine that communicates it out of sight, with what that puts on the wire, at
the moment it is handed over); on GPUs kernel and nccl
(commbench.timing.gpu_kernels). Between steps, outside every step's split:
consensus (measuring the consensus distance) and evaluate (scoring the models of a
run trained to accuracy).

Recording is a few clock reads and appends per step, so it is always on during the
measured steps: the job makes a `Recorder` and hands it to the loop, which runs each
measured step inside the recorder's `measured_step`; outside one, `record` keeps
nothing. After the job, rank 0 gathers every rank's spans (they pickle), puts them on
its own clock (commbench.timing.clock_alignment), splits the steps (commbench.timing.step_split) and
writes the timeline (commbench.timing.trace_file).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

from commbench.timing.wire import NOTHING, Sent

now = time.perf_counter

# A training step's compute phases, in the order it runs them (the forward pass
# includes the loss).
PHASES = ("forward", "backward", "optimizer")


@dataclass
class Span:
    """One span of a rank's time, on its own clock (time.perf_counter)."""

    step: int  # the measured step it belongs to (work between steps: the last one's)
    kind: str
    start: float
    end: Optional[float] = None  # None while open: close() ends it
    name: str = ""  # what the timeline shows (the kind where empty)
    nbytes: int = 0  # a communication piece's bytes
    peers: Optional[List[int]] = None  # the ranks a piece involves; None: every rank
    sent: int = 0  # a piece's bytes this rank put on the wire (commbench.timing.wire)
    messages: int = 0  # and the messages that carried them
    aside: bool = False  # a piece posted from a communication callback, not by the step
    # False for a piece whose messages move only while this rank waits inside the
    # transport (MPI's point-to-point, which has no thread of its own to move them)
    moves_alone: bool = True


class Recorder:
    """One rank's spans over one measurement, made by the job and handed to the loop that
    runs the measured steps (warm-up and the compute-only reference record nothing)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # pieces are recorded from callback threads too
        self.step = -1
        self.events: List[Span] = []
        self.sent = NOTHING  # over every step recorded, those keep_last forgot included

    @contextlib.contextmanager
    def measured_step(self) -> Iterator["Recorder"]:
        """One measured step: what the step, its strategy and their callbacks record
        (`record`) while the block runs is this recorder's; what runs between steps is
        no step's, so nothing records it."""
        global _IN_STEP
        self.step += 1
        outside, _IN_STEP = _IN_STEP, self
        try:
            yield self
        finally:
            _IN_STEP = outside

    def add(self, kind: str, start: float, end: Optional[float] = None, name: str = "",
            nbytes: int = 0, peers: Optional[Sequence[int]] = None,
            sent: Sent = NOTHING, aside: bool = False, moves_alone: bool = True) -> Span:
        """Record a span; with end None it is open until close(span)."""
        span = Span(self.step, kind, start, end, name, nbytes, list(peers) if peers else None,
                    sent.nbytes, sent.messages, aside, moves_alone)
        with self._lock:
            self.events.append(span)
            self.sent += sent
        return span

    @contextlib.contextmanager
    def between(self, kind: str) -> Iterator[None]:
        """`with recorder.between("consensus"):` records the block as work between
        measured steps (it belongs to the last one's timeline, not to its split);
        nothing before the first measured step."""
        start = now()
        yield
        if self.step >= 0:
            self.events.append(Span(self.step, kind, start, now()))

    def keep_last(self, steps: int) -> None:
        """Forget all but the last `steps` steps' spans (a long run's memory stays bounded)."""
        first = self.step + 1 - steps
        if self.events and self.events[0].step < first:
            self.events = [span for span in self.events if span.step >= first]

    def last_post(self) -> Optional[float]:
        """When the step at hand last handed a communication piece over (None: no piece
        yet); a piece a callback posted later (PowerSGD's P and Q) is no hand-over of the
        step's."""
        for span in reversed(self.events):
            if span.step != self.step:
                return None
            if span.kind == "comm" and not span.aside:
                return span.start
        return None


# The recorder whose measured step is running, set and cleared by its measured_step
# alone: a plugin's pieces are recorded from its own code and callback threads, which
# are handed no recorder.
_IN_STEP: Optional[Recorder] = None


def recording() -> bool:
    """Whether a measured step is running: what a piece records is kept (a plugin may
    skip working out its bytes otherwise)."""
    return _IN_STEP is not None


def record(kind: str, start: float, end: Optional[float] = None, name: str = "",
           nbytes: int = 0, peers: Optional[Sequence[int]] = None,
           sent: Sent = NOTHING, aside: bool = False, moves_alone: bool = True
           ) -> Optional[Span]:
    """Record a span in the measured step running (None outside one); with end None it
    is open until close(span)."""
    recorder = _IN_STEP
    if recorder is None:
        return None
    return recorder.add(kind, start, end, name, nbytes, peers, sent, aside, moves_alone)


def close(span: Optional[Span]) -> None:
    """End an open span now (from any thread: a communication piece completes there)."""
    if span is not None:
        span.end = now()


def last_post() -> Optional[float]:
    """When the measured step running last handed a piece over (Recorder.last_post);
    None outside a measured step."""
    recorder = _IN_STEP
    return recorder.last_post() if recorder is not None else None
