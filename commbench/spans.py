"""Where a step's time goes: the spans each rank records over the measured steps
(compute phases, communication pieces, waits for them), the split of every step
computed from them, and the Chrome trace-event file that `--timeline` writes.

Kinds of span: step; forward, backward, optimizer (compute); comm (a piece, from its
posting to its completion, with its bytes and the ranks it involves); post (the
critical path's cost of handing a piece over); wait (blocked on pieces). Between steps,
outside every step's split: consensus (measuring the consensus distance) and evaluate
(scoring the models of a run trained to accuracy).

Recording is a few clock reads and list appends per step, so it is always on during
the measured steps; the analysis runs on rank 0 after the job, on clocks aligned to
rank 0's. The split's parts (docs/run.md, "Where a step's time goes"):
compute + exposed + waiting + other = the step's wall time, and overlapped is the
communication that ran while compute did (hidden, so not in the sum). Waiting is the
part of a blocked interval before the last peer it waits on had even posted its own
piece (that peer's lateness, as wait-state analysis counts it); exposed is the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from commbench.results import write_new_file

now = time.perf_counter

COMPUTE = ("forward", "backward", "optimizer", "kernel")  # kernel: a GPU's (device_time)
PARTS = ("step", "compute", "overlapped", "exposed", "waiting", "other")
# An event: [step, kind, start, end, name, bytes, peers]; peers None = every rank.
Event = List[Any]


class Recorder:
    """One rank's spans. Off outside the measured steps, so warm-up leaves nothing."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything: a new measurement (a process may run several)."""
        self.on = False
        self.step = -1
        self.events: List[Event] = []

    def begin_step(self) -> float:
        self.step += 1
        return now()

    def add(self, kind: str, start: float, end: Optional[float] = None, name: str = "",
            nbytes: int = 0, peers: Optional[Sequence[int]] = None) -> Optional[Event]:
        """Record a span; with end None it is open until close(event)."""
        if not self.on:
            return None
        event = [self.step, kind, start, end, name, nbytes, list(peers) if peers else None]
        self.events.append(event)
        return event

    def add_between(self, kind: str, start: float, end: float) -> None:
        """Record work between measured steps (it belongs to the last one's timeline, not
        to its split); nothing before the first measured step."""
        if self.step >= 0:
            self.events.append([self.step, kind, start, end, "", 0, None])

    def keep_last(self, steps: int) -> None:
        """Forget all but the last `steps` steps' spans (a long run's memory stays bounded)."""
        first = self.step + 1 - steps
        if self.events and self.events[0][0] < first:
            self.events = [e for e in self.events if e[0] >= first]


RECORDER = Recorder()


def record(kind: str, start: float, end: Optional[float] = None, name: str = "",
           nbytes: int = 0, peers: Optional[Sequence[int]] = None) -> Optional[Event]:
    return RECORDER.add(kind, start, end, name, nbytes, peers)


def close(event: Optional[Event]) -> None:
    """End an open span now (from any thread: a communication piece completes there)."""
    if event is not None:
        event[3] = now()


@contextlib.contextmanager
def between(kind: str) -> Iterator[None]:
    """`with between("consensus"):` records the block as work between measured steps."""
    start = now()
    yield
    RECORDER.add_between(kind, start, now())


def last_post() -> Optional[float]:
    """When this step's last communication piece was posted (None: no piece yet)."""
    for event in reversed(RECORDER.events):
        if event[0] != RECORDER.step:
            return None
        if event[1] == "comm":
            return event[2]
    return None


# Interval arithmetic on small sorted lists of (start, end).

def union(spans: Iterable[Tuple[float, float]]) -> List[Tuple[float, float]]:
    merged: List[Tuple[float, float]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(spans: Sequence[Tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def overlap(a: Sequence[Tuple[float, float]], b: Sequence[Tuple[float, float]]) -> float:
    """Length of the intersection of two unions."""
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def minus(a: Sequence[Tuple[float, float]], b: Sequence[Tuple[float, float]]
          ) -> List[Tuple[float, float]]:
    """The parts of union a outside union b."""
    out = []
    for start, end in a:
        cursor = start
        for s, e in b:
            if e <= cursor or s >= end:
                continue
            if s > cursor:
                out.append((cursor, s))
            cursor = max(cursor, e)
        if cursor < end:
            out.append((cursor, end))
    return out


def split_steps(events: Sequence[Sequence[Event]], offsets: Sequence[float]
                ) -> List[List[List[float]]]:
    """[rank][step] -> seconds of PARTS, from every rank's events; offsets[r] is added
    to rank r's clock to put it on rank 0's. A step without compute phases (an engine
    that times its own steps) gets no split: its row is empty."""
    by_step: List[Dict[int, Dict[str, list]]] = []
    for rank, mine in enumerate(events):
        steps: Dict[int, Dict[str, list]] = {}
        for step, kind, start, end, _name, _bytes, peers in mine:
            if end is None:
                continue
            steps.setdefault(step, {}).setdefault(kind, []).append(
                (start + offsets[rank], end + offsets[rank], peers))
        by_step.append(steps)
    # Every rank posts a step's pieces in the same order (DDP's buckets, the gradients,
    # the one averaging step), so the k-th piece of a step is the same piece everywhere.
    posts = [{step: sorted(s for s, _, _ in kinds.get("comm", []))
              for step, kinds in steps.items()} for steps in by_step]
    world = range(len(events))
    out: List[List[List[float]]] = []
    for rank, steps in enumerate(by_step):
        rows = []
        for step in sorted(steps):
            kinds = steps[step]
            if "step" not in kinds or not any(k in kinds for k in COMPUTE):
                rows.append([])
                continue
            (start, end, _), = kinds["step"]
            wall = end - start
            blocked = union((s, e) for k in ("post", "wait") for s, e, _ in kinds.get(k, []))
            # A phase that blocks inside (DDP's forward and backward) computes only
            # outside its waits.
            compute = minus(union((s, e) for k in COMPUTE for s, e, _ in kinds.get(k, [])),
                            blocked)
            pieces = sorted(kinds.get("comm", []), key=lambda piece: piece[0])
            exposed = length(union((s, e) for s, e, _ in kinds.get("post", [])))
            waiting = 0.0
            for s, e in union((s, e) for s, e, _ in kinds.get("wait", [])):
                awaited = [piece for piece in pieces if piece[0] <= e]  # posted by its end
                peers = {rank}
                for _, _, who in awaited:
                    peers |= set(world if who is None else who)
                latest = max((max(posts[q].get(step, [])[:len(awaited)], default=s)
                              for q in peers), default=s)
                late = max(0.0, min(e, latest) - s)
                waiting += late
                exposed += (e - s) - late
            comm = union((s, e) for s, e, _ in pieces)
            used = length(compute)
            rows.append([wall, used, overlap(comm, compute), exposed, waiting,
                         wall - used - exposed - waiting])
        out.append(rows)
    return out


def summarize(split: Optional[Sequence[Sequence[Sequence[float]]]]) -> Optional[Dict[str, Any]]:
    """summary.step_split: per part, seconds per step over all ranks and steps (mean,
    median and the 10th/90th percentiles); the means of the parts sum to the step's."""
    import numpy as np

    if split is None:
        return None
    rows = np.array([row for rank in split for row in rank if row], dtype=float)
    if rows.size == 0:
        return None
    return {part: {"mean": float(rows[:, i].mean()), "median": float(np.median(rows[:, i])),
                   "p10": float(np.percentile(rows[:, i], 10)),
                   "p90": float(np.percentile(rows[:, i], 90))}
            for i, part in enumerate(PARTS)}


def clock_offsets(ctx, rounds: int = 8) -> Tuple[List[float], List[float]]:
    """Each rank's clock offset to rank 0's (add it to put a time on rank 0's clock) and
    its uncertainty (half the best round trip), by ping-pong with rank 0 (Cristian's
    method), one rank at a time. Every rank gets both lists."""
    import torch
    import torch.distributed as dist

    offsets, errors = [0.0] * ctx.world_size, [0.0] * ctx.world_size
    stamp = torch.zeros(1, dtype=torch.float64, device=ctx.device)
    for peer in range(1, ctx.world_size):
        best = None
        for _ in range(rounds):
            if ctx.rank == 0:
                sent = now()
                dist.send(stamp, peer)
                dist.recv(stamp, peer)
                back = now()
                if best is None or back - sent < best[0]:
                    best = (back - sent, (sent + back) / 2 - float(stamp.item()))
            elif ctx.rank == peer:
                dist.recv(stamp, 0)
                stamp.fill_(now())
                dist.send(stamp, 0)
        if ctx.rank == 0:
            errors[peer], offsets[peer] = best[0] / 2, best[1]
    shared = torch.tensor(offsets + errors, dtype=torch.float64, device=ctx.device)
    dist.broadcast(shared, 0)
    values = shared.tolist()
    return values[:ctx.world_size], values[ctx.world_size:]


def trace_events(events: Sequence[Sequence[Event]], offsets: Sequence[float],
                 names: Sequence[str], steps: Optional[int] = None) -> List[Dict[str, Any]]:
    """Chrome trace events (Perfetto, chrome://tracing): one process per rank named
    names[rank], a compute track (steps, their phases and waits), communication
    tracks (pieces; a second track only where pieces overlap) and on GPUs the device's
    kernels (device_time). Times in microseconds
    from the earliest span; only the last `steps` steps when given."""
    first_step = 0
    if steps is not None:
        first_step = max(0, max((e[0] for mine in events for e in mine), default=0) + 1 - steps)
    spans = [(rank, e) for rank, mine in enumerate(events) for e in mine
             if e[3] is not None and e[0] >= first_step]
    origin = min((e[2] + offsets[rank] for rank, e in spans), default=0.0)
    out: List[Dict[str, Any]] = []
    for rank, name in enumerate(names):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                    "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 0,
                    "args": {"name": "compute"}})
    lanes: Dict[Tuple[int, str], List[float]] = {}  # (rank, kind) -> each track's last end
    for rank, (step, kind, start, end, name, nbytes, peers) in sorted(
            spans, key=lambda item: (item[0], item[1][2], -item[1][3])):
        ts = (start + offsets[rank] - origin) * 1e6
        event = {"ph": "X", "name": name or kind, "cat": kind, "pid": rank, "ts": ts,
                 "dur": max(0.0, (end - start) * 1e6), "args": {"step": step}}
        event["tid"] = 0
        if kind in LANES:
            title, first = LANES[kind]
            ends = lanes.setdefault((rank, kind), [])
            lane = next((i for i, busy in enumerate(ends) if busy <= start), len(ends))
            if lane == len(ends):
                ends.append(end)
                out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": first + lane,
                            "args": {"name": title + (f" {lane + 1}" if lane else "")}})
            ends[lane] = end
            event["tid"] = first + lane
        if kind == "comm":
            event["args"].update(bytes=nbytes, peers="all" if peers is None else peers)
        out.append(event)
    return out


# Spans that may overlap each other get tracks of their own (a new one only where they
# do): kind -> (track name, its first thread id).
LANES = {"comm": ("communication", 1), "kernel": ("GPU compute", 100),
         "nccl": ("GPU communication", 200)}


def beside(path: str, name: str, separator: str = ".") -> str:
    """A file named after path, for another trace: an engine's own timeline beside
    commbench's (trace.json -> trace.horovod.json), a sweep's job's (trace-none-n2.json)."""
    stem, dot, suffix = path.rpartition(".")
    if dot and "/" not in suffix:
        return f"{stem}{separator}{name}.{suffix}"
    return f"{path}{separator}{name}"


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
