"""Where a step's time goes: the split of every measured step into its parts, from
the spans every rank recorded (commbench.timing.spans), on clocks aligned to rank 0's
(commbench.timing.clock_alignment); and its summary in the result file.

The parts (docs/run.md, "Where a step's time goes"): compute + codec + exposed +
waiting + injected + other = the step's wall time, and overlapped is the communication that ran
while compute did (hidden, so not in the sum). Waiting is the part of a blocked interval
before the last peer it waits on had even posted its own piece (that peer's lateness,
as wait-state analysis counts it), or, where the piece's messages move only while that
peer waits for them too (MPI's point-to-point), before the peer began to wait; exposed
is the rest. Codec is compressing and
decompressing messages where it holds the step up: on the step's own thread, or in a
communication callback while the step waits for it (a callback's work beside the
step's compute is hidden, as overlapped communication is). On GPUs the split is the
device's (commbench.timing.gpu_kernels): a codec's kernels count as compute there, and its
host spans are in the timeline only. Injected is a rank slowed on purpose idling
(--slow-ranks, commbench.job.straggler): its own part, so that a straggler made on purpose
is never read as compute, waiting or communication.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, NamedTuple, Optional, Sequence

from commbench.timing.intervals import Interval, inside, length, minus, overlap, union

if TYPE_CHECKING:
    from commbench.timing.spans import Span

COMPUTE = ("forward", "backward", "optimizer", "kernel")  # kernel: a GPU's (device_time)
# the later parts last: rows written before they existed keep their columns.
PARTS = ("step", "compute", "overlapped", "exposed", "waiting", "other", "codec", "injected")
LATER = ("codec", "injected")  # parts that results of earlier versions do not have
# A step's row in the result file: seconds of each of PARTS, in that order.
Row = List[float]


class Stretch(NamedTuple):
    """A span's time on rank 0's clock, and the ranks it involves (None: every rank)."""

    start: float
    end: float
    peers: Optional[List[int]]
    moves_alone: bool = True  # a piece's: commbench.timing.spans.Span.moves_alone


Kinds = Dict[str, List[Stretch]]  # a step's stretches by kind of span


def split_steps(events: Sequence[Sequence["Span"]], offsets: Sequence[float]
                ) -> List[List[Row]]:
    """[rank][step] -> seconds of PARTS, from every rank's spans; offsets[r] is added
    to rank r's clock to put it on rank 0's. A step without compute phases (an engine
    that times its own steps) gets no split: its row is empty."""
    by_step = [on_rank_0s_clock(mine, offsets[rank]) for rank, mine in enumerate(events)]
    # Every rank posts a step's pieces in the same order (DDP's buckets, the gradients,
    # the one averaging step), so the k-th piece of a step is the same piece everywhere.
    posts = [{step: ready_times(kinds) for step, kinds in steps.items()} for steps in by_step]
    world = range(len(events))
    return [[split_step(steps[step], rank, step, posts, world) for step in sorted(steps)]
            for rank, steps in enumerate(by_step)]


def ready_times(kinds: Kinds) -> List[float]:
    """When each of a rank's pieces of a step, in the order posted, could move: when it
    was posted; for one whose messages move only while the rank waits (MPI's
    point-to-point), when the rank began the wait it completes in. A peer blocked on it
    before then waits for that rank, not for the network."""
    waits = sorted(kinds.get("wait", []), key=lambda wait: wait.start)
    ready = []
    for piece in sorted(kinds.get("comm", []), key=lambda piece: piece.start):
        at = piece.start
        if not piece.moves_alone:
            at = max(at, next((w.start for w in waits if w.end > piece.start), at))
        ready.append(at)
    return ready


def on_rank_0s_clock(mine: Sequence["Span"], offset: float) -> Dict[int, Kinds]:
    """One rank's closed spans by step and kind, moved onto rank 0's clock."""
    steps: Dict[int, Kinds] = {}
    for span in mine:
        if span.end is None:
            continue
        steps.setdefault(span.step, {}).setdefault(span.kind, []).append(
            Stretch(span.start + offset, span.end + offset, span.peers,
                    span.moves_alone))
    return steps


def intervals(stretches: Iterable[Stretch]) -> List[Interval]:
    return [(stretch.start, stretch.end) for stretch in stretches]


def split_step(kinds: Kinds, rank: int, step: int, posts: List[Dict[int, List[float]]],
               world: range) -> Row:
    """One rank's step as a row of PARTS (empty without compute phases)."""
    if "step" not in kinds or not any(k in kinds for k in COMPUTE):
        return []
    whole, = kinds["step"]
    wall = whole.end - whole.start
    blocked = union(intervals(s for k in ("post", "wait") for s in kinds.get(k, [])))
    codec = inside(union(intervals(kinds.get("codec", []))
                         + inside(union(intervals(kinds.get("codec-callback", []))), blocked)),
                   [(whole.start, whole.end)])
    # A phase that blocks inside (DDP's forward and backward) computes only outside its
    # waits, and outside the codec work it runs (DDP's hooks run inside backward).
    compute = minus(minus(union(intervals(s for k in COMPUTE for s in kinds.get(k, []))),
                          blocked), codec)
    pieces = sorted(kinds.get("comm", []), key=lambda piece: piece.start)
    exposed = length(minus(union(intervals(kinds.get("post", []))), codec))
    waiting = 0.0
    for start, end in union(intervals(kinds.get("wait", []))):
        free = length(minus([(start, end)], codec))  # not decoding what arrived
        late = lateness(start, end, pieces, rank, posts, step, world)
        late = length(minus([(start, start + late)], codec))
        waiting += late
        exposed += free - late
    comm = union(intervals(pieces))
    used, coding = length(compute), length(codec)
    injected = length(union(intervals(kinds.get("injected", []))))
    return [wall, used, overlap(comm, compute), exposed, waiting,
            wall - used - coding - exposed - waiting - injected, coding, injected]


def lateness(start: float, end: float, pieces: List[Stretch], rank: int,
             posts: List[Dict[int, List[float]]], step: int, world: range) -> float:
    """How much of a wait from start to end came before the last peer it waits on had
    posted its own piece of those awaited (the k-th piece of the step everywhere), or,
    for a piece that moves only while its rank waits, before that peer began waiting."""
    awaited = [piece for piece in pieces if piece.start <= end]  # posted by its end
    peers = {rank}
    for piece in awaited:
        peers |= set(world if piece.peers is None else piece.peers)
    latest = max((max(posts[q].get(step, [])[:len(awaited)], default=start) for q in peers),
                 default=start)
    return max(0.0, min(end, latest) - start)


def summarize(split: Optional[Sequence[Sequence[Row]]]) -> Optional[Dict[str, Any]]:
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
            for i, part in enumerate(PARTS[:rows.shape[1]])}
