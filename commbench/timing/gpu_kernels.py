"""On GPUs, when the device did the work. The host's clock sees when a kernel was
queued, not when it ran, so with `--timeline` torch.profiler records every kernel of
the measured steps (CUPTI through Kineto). NCCL's kernels are communication, every
other kernel (and copy) compute. Kineto stamps them in Unix time; they are moved onto
the clock commbench's spans read and given to the step whose host span holds them (a
step ends with a device sync, so its kernels end inside it).

From those, each step splits as on the CPU (commbench.timing.step_split): compute is the device
busy with compute kernels; a stretch where only NCCL kernels run is the step blocked on
communication; an NCCL kernel that started before the last rank had started its
matching one (the k-th of the step everywhere) waited for that rank, since NCCL's
kernels spin until every peer has joined. Which peers a neighbor exchange's kernel
needs is not in its name, so every rank counts: its waiting is an upper bound.
"""

from __future__ import annotations

import bisect
import contextlib
import time
import warnings
from dataclasses import replace
from typing import Iterator, List, NamedTuple, Sequence, Tuple

from commbench.timing.intervals import minus, union
from commbench.timing.spans import Recorder, Span

KERNEL, NCCL = "kernel", "nccl"  # span kinds: a compute kernel, an NCCL kernel
# A run whose kernels mostly fall outside its steps has clocks that do not agree:
# its split would be wrong, so it is not computed.
LEAST_INSIDE = 0.9


class Kernel(NamedTuple):
    """One event on the device, on time.perf_counter's clock."""

    name: str
    start: float
    end: float


@contextlib.contextmanager
def kernels_of_steps(device, enabled: bool, recorder: Recorder) -> Iterator[None]:
    """Record the device's kernels while the block runs and add them to the recorder's
    spans, in the steps that hold them (CUDA with enabled only; otherwise nothing)."""
    if not enabled or getattr(device, "type", "cpu") != "cuda":
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        # One profiling cycle is all this records: torch's warning that a later cycle
        # would clear the events does not apply.
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            yield
    wall, perf = time.time_ns(), time.perf_counter()
    recorder.events.extend(in_steps(device_kernels(prof, wall, perf), recorder.events))


def device_kernels(prof, wall_ns: int, perf: float, device_type=None) -> List[Kernel]:
    """Every event on the device (CUDA unless told), on
    time.perf_counter's clock, given one reading of both clocks taken together."""
    from torch.autograd import DeviceType

    kind = DeviceType.CUDA if device_type is None else device_type
    events = [e for e in prof.profiler.kineto_results.events() if e.device_type() == kind]
    if events and not hasattr(events[0], "start_ns"):
        return []  # torch < 2.0 stamps events on another clock: no kernels, so no split
    return [Kernel(e.name(), *on_perf_clock((e.start_ns(), e.end_ns()), wall_ns, perf))
            for e in events]


def on_perf_clock(unix_ns: Sequence[int], wall_ns: int, perf: float) -> Tuple[float, ...]:
    """Unix times in nanoseconds as time.perf_counter() readings."""
    return tuple(perf + (t - wall_ns) / 1e9 for t in unix_ns)


def in_steps(kernels: Sequence[Kernel], events: Sequence[Span]) -> List[Span]:
    """Kernel spans in the step whose host span holds each one's start; kernels outside
    every step (between steps) are left out."""
    steps = sorted((e for e in events if e.kind == "step" and e.end is not None),
                   key=lambda e: (e.start, e.end, e.step))
    starts = [s.start for s in steps]
    out = []
    for name, start, end in kernels:
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0 and start <= steps[i].end:
            kind = NCCL if "nccl" in name.lower() else KERNEL
            out.append(Span(steps[i].step, kind, start, end, name))
    return out


def aligned(events: Sequence[Span]) -> bool:
    """Whether a rank's kernels lie in its steps, as a device sync at each step's end
    makes them: nearly all end before their step does, and every step holds some
    (every step runs kernels). Clocks that disagree by more than a step leave the steps
    at one end of the window without kernels, which the first test alone would miss."""
    ends = {e.step: e.end for e in events if e.kind == "step"}
    kernels = [e for e in events if e.kind in (KERNEL, NCCL)]
    inside = sum(1 for e in kernels if e.end <= ends[e.step] + 1e-4)
    every_step = set(ends) <= {e.step for e in kernels}
    return bool(kernels) and every_step and inside >= LEAST_INSIDE * len(kernels)


def split_view(events: Sequence[Span]) -> List[Span]:
    """The spans the step split reads on a GPU: each step, its compute kernels, its
    NCCL kernels as communication pieces (posted when they started), and as waits the
    stretches where the device ran NCCL kernels and no compute."""
    out: List[Span] = []
    by_step: dict = {}
    for e in events:
        if e.kind in ("step", "injected"):
            out.append(replace(e))
        elif e.kind in (KERNEL, NCCL):
            by_step.setdefault(e.step, {KERNEL: [], NCCL: []})[e.kind].append(e)
    for step, kinds in by_step.items():
        out.extend(replace(e) for e in kinds[KERNEL])
        out.extend(Span(step, "comm", e.start, e.end, e.name) for e in kinds[NCCL])
        compute = union((e.start, e.end) for e in kinds[KERNEL])
        blocked = minus(union((e.start, e.end) for e in kinds[NCCL]), compute)
        out.extend(Span(step, "wait", start, end) for start, end in blocked)
    return out


def has_kernels(events: Sequence[Sequence[Span]]) -> bool:
    return any(e.kind in (KERNEL, NCCL) for mine in events for e in mine)
