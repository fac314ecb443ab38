"""The Chrome trace-event file that `--timeline` writes (Perfetto, chrome://tracing):
every rank's spans (commbench.timing.spans) on rank 0's clock, one process per rank; and the
checks and names of trace files."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from commbench.config.flags import flag, positive_int
from commbench.config.sections import Section
from commbench.errors import UsageError
from commbench.result.store import write_new_file
from commbench.timing import failure_track

if TYPE_CHECKING:
    from commbench.timing.spans import Span

# Spans that may overlap each other get tracks of their own (a new one only where they
# do): kind -> (track name, its first thread id).
LANES = {"comm": ("communication", 1), "kernel": ("GPU compute", 100),
         "nccl": ("GPU communication", 200), "codec-callback": ("codec in callbacks", 300),
         "handed": ("handed to the engine", 400)}
# Steps a timeline keeps by default: a few hundred events per rank and step at most, so
# a file of 16 ranks stays within tens of megabytes.
TIMELINE_STEPS = 200


@dataclass(frozen=True)
class TimelineFlags(Section):
    title = "the timeline"

    timeline: Optional[str] = flag(
        None, "write every rank's spans (compute phases, communication pieces, waits) to "
        "FILE in Chrome's trace-event format (Perfetto, chrome://tracing)", metavar="FILE")
    timeline_steps: int = flag(
        TIMELINE_STEPS, "the most measured steps a --timeline file holds (the last ones)",
        positive_int, "N")

    @classmethod
    def unread(cls, config) -> Dict[str, str]:
        if config.timeline is not None:
            return {}
        return {"timeline_steps": "sets how many steps a --timeline file holds; no "
                "--timeline is written: give one, or leave it out"}


def trace_events(events: Sequence[Sequence["Span"]], offsets: Sequence[float],
                 names: Sequence[str], steps: Optional[int] = None,
                 failures: Sequence[failure_track.Failure] = ()) -> List[Dict[str, Any]]:
    """Chrome trace events: one process per rank named names[rank], a compute track
    (steps, their phases and waits), communication tracks (pieces; a second track only
    where pieces overlap), on GPUs the device's kernels (device_time) and the failures
    of --fail with their recoveries (on rank 0's clock). Times in microseconds from the
    earliest span or failure; only the last `steps` steps, and the failures that end in
    them, when given."""
    first_step = 0
    if steps is not None:
        last = max((span.step for mine in events for span in mine), default=0)
        first_step = max(0, last + 1 - steps)
    shown = [(rank, span) for rank, mine in enumerate(events) for span in mine
             if span.end is not None and span.step >= first_step]
    first = min((span.start + offsets[rank] for rank, span in shown), default=0.0)
    since = first if first_step > 0 else None
    failures = [f for f in failures if since is None or f.end >= since]
    origin = min([first] + [f.at for f in failures])
    out = [meta for rank, name in enumerate(names) for meta in process_metadata(rank, name)]
    lanes: Dict[Tuple[int, str], List[float]] = {}  # (rank, kind) -> each track's last end
    for rank, span in sorted(shown, key=by_rank_and_time):
        event = {"ph": "X", "name": span.name or span.kind, "cat": span.kind, "pid": rank,
                 "ts": (span.start + offsets[rank] - origin) * 1e6,
                 "dur": max(0.0, (span.end - span.start) * 1e6), "args": {"step": span.step}}
        event["tid"] = 0
        if span.kind in LANES:
            event["tid"] = lane_of(span, rank, lanes, out)
        if span.kind == "comm":
            event["args"].update(bytes=span.nbytes,
                                 peers="all" if span.peers is None else span.peers)
        out.append(event)
    return out + failure_track.trace_events(failures, origin, len(names))


def by_rank_and_time(ranked: Tuple[int, "Span"]) -> Tuple[int, float, float]:
    """A rank's spans in time order, the longer first where two start together (so
    that a span comes before those nested in it)."""
    rank, span = ranked
    return rank, span.start, -span.end


def process_metadata(rank: int, name: str) -> List[Dict[str, Any]]:
    return [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": name}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
             "args": {"sort_index": rank}},
            {"ph": "M", "name": "thread_name", "pid": rank, "tid": 0,
             "args": {"name": "compute"}}]


def lane_of(span: "Span", rank: int, lanes: Dict[Tuple[int, str], List[float]],
            out: List[Dict[str, Any]]) -> int:
    """The thread id of the first of its kind's tracks free when the span starts; a new
    track (named in out) where none is."""
    title, first = LANES[span.kind]
    ends = lanes.setdefault((rank, span.kind), [])
    lane = next((i for i, busy in enumerate(ends) if busy <= span.start), len(ends))
    if lane == len(ends):
        ends.append(span.end)
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": first + lane,
                    "args": {"name": title + (f" {lane + 1}" if lane else "")}})
    ends[lane] = span.end
    return first + lane


def beside(path: str, name: str, separator: str = ".") -> str:
    """A file named after path, for another trace: an engine's own timeline beside
    commbench's (trace.json -> trace.horovod.json), a sweep's job's (trace-none-n2.json)."""
    stem, dot, suffix = path.rpartition(".")
    if dot and "/" not in suffix:
        return f"{stem}{separator}{name}.{suffix}"
    return f"{path}{separator}{name}"


def check_new(path: str, flag: str) -> None:
    """UsageError, naming the flag, unless `path` is a file that can be written and does
    not exist yet: commbench never overwrites a measurement."""
    try:
        check_writable(path)
    except OSError as e:
        raise UsageError(f"argument {flag}: {e}") from None
    if os.path.exists(path):
        raise UsageError(f"argument {flag}: {path} exists; commbench never overwrites a "
                         "measurement")


def check_writable(path: str) -> None:
    """Raise OSError with a one-line reason when `path` cannot be written as a file."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory, not a file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder} does not exist")
    # A file really made and removed: permission bits say nothing to root, nor of a
    # read-only or full file system.
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as e:
        raise OSError(f"cannot write to {folder} ({e.strerror or e})") from None


def write_trace(path: str, trace: List[Dict[str, Any]], metadata: Dict[str, Any]) -> None:
    """The trace file, written atomically and never over an existing file."""
    write_new_file(path, json.dumps({"traceEvents": trace, "displayTimeUnit": "ms",
                                     "otherData": metadata}).encode())
