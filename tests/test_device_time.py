"""On GPUs, the device's kernels (commbench.timing.gpu_kernels): Kineto's Unix-time stamps put
on the spans' clock (checked with a CPU profile, whose events Kineto stamps on the same
clock as CUPTI's), kernels given to their steps, and the split they make: compute
kernels, NCCL kernels hidden behind them, and an NCCL kernel that waited for a late
rank. No GPU is needed."""

import time

import pytest

from commbench.timing import gpu_kernels, spans
from commbench.timing.spans import Span
from commbench.timing.step_split import PARTS, split_steps
from commbench.timing.trace_file import trace_events
from test_spans import check_trace


def test_kineto_stamps_land_on_the_spans_clock():
    import torch
    from torch.autograd import DeviceType

    if not hasattr(getattr(torch._C._autograd, "_KinetoEvent", None), "start_ns"):
        pytest.skip("Kineto's events carry Unix nanoseconds from torch 2.0; before, "
                    "device_time records no kernels")
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        before = time.perf_counter()
        with record_function("anchor"):
            torch.randn(200, 200) @ torch.randn(200, 200)
        after = time.perf_counter()
    wall, perf = time.time_ns(), time.perf_counter()
    (name, start, end), = [k for k in gpu_kernels.device_kernels(prof, wall, perf,
                                                                  DeviceType.CPU)
                           if k.name == "anchor"]
    slack = 2e-3  # the clocks are read one after the other
    assert before - slack <= start <= end <= after + slack


def gpu_step(step, start, kernels, nccl):
    """A step's host span from start, and its kernels: (start, end) offsets from it."""
    events = [Span(step, "step", start, start + 0.1)]
    events += [Span(step, "kernel", start + s, start + e, "conv") for s, e in kernels]
    events += [Span(step, "nccl", start + s, start + e, "ncclKernel_AllReduce")
               for s, e in nccl]
    return events


def test_kernels_go_to_the_step_that_holds_them_and_nccl_is_communication():
    events = [Span(0, "step", 1.0, 1.1), Span(1, "step", 1.2, 1.3)]
    kernels = [("volta_sgemm", 1.01, 1.02), ("ncclDevKernel_AllReduce_Sum_f32", 1.05, 1.08),
               ("vectorized_elementwise", 1.15, 1.16),  # between steps: no step's
               ("volta_sgemm", 1.21, 1.25)]
    got = gpu_kernels.in_steps(kernels, events)
    assert [(e.step, e.kind, e.name) for e in got] == [
        (0, "kernel", "volta_sgemm"), (0, "nccl", "ncclDevKernel_AllReduce_Sum_f32"),
        (1, "kernel", "volta_sgemm")]


def test_a_gpu_step_splits_into_compute_hidden_exposed_and_waiting():
    # rank 0: compute 0-40 ms and 50-60 ms; its allreduce kernel starts at 30 ms and
    # ends at 80 ms. Rank 1 starts its allreduce at 60 ms: rank 0's kernel waited for it.
    rank0 = gpu_step(0, 0.0, [(0.0, 0.04), (0.05, 0.06)], [(0.03, 0.08)])
    rank1 = gpu_step(0, 0.0, [(0.0, 0.06)], [(0.06, 0.08)])
    views = [gpu_kernels.split_view(r) for r in (rank0, rank1)]
    (row0,), (row1,) = split_steps(views, [0.0, 0.0])
    parts = dict(zip(PARTS, row0))
    assert parts["compute"] == pytest.approx(0.05)
    assert parts["overlapped"] == pytest.approx(0.02)  # 30-40 and 50-60 ms
    # blocked (NCCL alone) 40-50 and 60-80 ms: before rank 1 joined at 60 ms it waited
    assert parts["waiting"] == pytest.approx(0.01)
    assert parts["exposed"] == pytest.approx(0.02)
    assert parts["other"] == pytest.approx(0.02)  # device idle: 80-100 ms
    assert sum(row0[1:2] + row0[3:]) == pytest.approx(row0[0])
    parts1 = dict(zip(PARTS, row1))
    assert parts1["waiting"] == pytest.approx(0.0) and parts1["exposed"] == pytest.approx(0.02)


def test_kernels_outside_their_steps_mean_the_clocks_disagree():
    good = gpu_step(0, 0.0, [(0.0, 0.05)], [(0.05, 0.08)])
    assert gpu_kernels.aligned(good)
    late = gpu_step(0, 0.0, [(0.5, 0.6)], [])  # ends after its step's host span
    assert not gpu_kernels.aligned(late)
    assert not gpu_kernels.aligned([Span(0, "step", 0.0, 0.1)])  # no kernels


def test_clocks_off_by_more_than_a_step_are_caught():
    """Kernels of steps 0-3 stamped a step and a half late: those that still start
    inside a step land in the wrong one and fit there, but the first step is empty."""
    host = [Span(s, "step", 0.1 * s, 0.1 * s + 0.1) for s in range(4)]
    kernels = [("conv", 0.1 * s + 0.15 + 0.01, 0.1 * s + 0.15 + 0.03) for s in range(4)]
    kept = gpu_kernels.in_steps(kernels, host)
    assert kept and all(e.end <= 0.1 * e.step + 0.1 for e in kept)  # the old test passes
    assert not gpu_kernels.aligned(host + kept)
    right = gpu_kernels.in_steps([(n, a - 0.15, b - 0.15) for n, a, b in kernels], host)
    assert gpu_kernels.aligned(host + right)


def test_the_timeline_shows_the_kernels_on_tracks_of_their_own():
    events = gpu_step(0, 0.0, [(0.0, 0.04), (0.01, 0.02)], [(0.03, 0.08)])
    trace = trace_events([events], [0.0], ["rank 0 (gpu)"])
    check_trace(trace, 1)
    tracks = {e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert tracks == {"compute", "GPU compute", "GPU compute 2", "GPU communication"}


def test_nothing_is_profiled_on_the_cpu():
    recorder = spans.Recorder()
    with gpu_kernels.kernels_of_steps(type("D", (), {"type": "cpu"})(), True, recorder):
        pass
    assert recorder.events == []
