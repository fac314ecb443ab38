"""The spans each rank records over the measured steps: what a step's time went to,
as typed records (`Span`) that one recorder per process collects.

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
measured steps. After the job, rank 0 gathers every rank's spans (they pickle), puts
them on its own clock (commbench.timing.clock_alignment), splits the steps
(commbench.timing.step_split) and writes the timeline (commbench.timing.trace_file).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

from commbench.timing.wire import NOTHING, Sent

now = time.perf_counter


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
    """One rank's spans. Off outside the measured steps, so warm-up leaves nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # pieces are recorded from callback threads too
        self.reset()

    def reset(self) -> None:
        """Forget everything: a new measurement (a process may run several)."""
        self.on = False
        self.step = -1
        self.events: List[Span] = []
        self.sent = NOTHING  # over every step recorded, those keep_last forgot included

    def begin_step(self) -> float:
        self.step += 1
        return now()

    def add(self, kind: str, start: float, end: Optional[float] = None, name: str = "",
            nbytes: int = 0, peers: Optional[Sequence[int]] = None,
            sent: Sent = NOTHING, aside: bool = False, moves_alone: bool = True
            ) -> Optional[Span]:
        """Record a span; with end None it is open until close(span)."""
        if not self.on:
            return None
        span = Span(self.step, kind, start, end, name, nbytes, list(peers) if peers else None,
                    sent.nbytes, sent.messages, aside, moves_alone)
        with self._lock:
            self.events.append(span)
            self.sent += sent
        return span

    def add_between(self, kind: str, start: float, end: float) -> None:
        """Record work between measured steps (it belongs to the last one's timeline, not
        to its split); nothing before the first measured step."""
        if self.step >= 0:
            self.events.append(Span(self.step, kind, start, end))

    def keep_last(self, steps: int) -> None:
        """Forget all but the last `steps` steps' spans (a long run's memory stays bounded)."""
        first = self.step + 1 - steps
        if self.events and self.events[0].step < first:
            self.events = [span for span in self.events if span.step >= first]


RECORDER = Recorder()


def record(kind: str, start: float, end: Optional[float] = None, name: str = "",
           nbytes: int = 0, peers: Optional[Sequence[int]] = None,
           sent: Sent = NOTHING, aside: bool = False, moves_alone: bool = True
           ) -> Optional[Span]:
    return RECORDER.add(kind, start, end, name, nbytes, peers, sent, aside, moves_alone)


def close(span: Optional[Span]) -> None:
    """End an open span now (from any thread: a communication piece completes there)."""
    if span is not None:
        span.end = now()


@contextlib.contextmanager
def between(kind: str) -> Iterator[None]:
    """`with between("consensus"):` records the block as work between measured steps."""
    start = now()
    yield
    RECORDER.add_between(kind, start, now())


def last_post() -> Optional[float]:
    """When the step last handed a communication piece over (None: no piece yet); a
    piece a callback posted later (PowerSGD's P and Q) is no hand-over of the step's."""
    for span in reversed(RECORDER.events):
        if span.step != RECORDER.step:
            return None
        if span.kind == "comm" and not span.aside:
            return span.start
    return None
