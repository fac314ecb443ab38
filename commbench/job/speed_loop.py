"""The timed training loop. It knows no backend and no strategy: it calls a
training step, syncs the device, and reads the clock."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from commbench.config.flags import flag, non_negative_float, non_negative_int, positive_int
from commbench.config.sections import Section
from commbench.timing.spans import PHASES, Recorder

if TYPE_CHECKING:  # pragma: no cover
    from commbench.job.training_step import TrainingStep


@dataclass(frozen=True)
class SpeedRunFlags(Section):
    title = "a speed run (timed iterations)"

    num_warmup_batches: int = flag(10, "untimed batches before the benchmark", non_negative_int)
    num_batches_per_iter: int = flag(10, "batches per timed iteration", positive_int)
    num_iters: int = flag(10, "timed iterations", positive_int)
    reference_iters: int = flag(
        3, "iterations of the compute-only reference measured in the same job, half before "
        "the run and half after it (for in-job scaling efficiency; 0 = skip)",
        non_negative_int)
    reference_seconds: float = flag(
        1.0, "the least wall-clock time of each half of the compute-only reference",
        non_negative_float, "SECONDS")

    @classmethod
    def unread(cls, config) -> Dict[str, str]:
        if not config.trains_to_accuracy:
            return {}
        return {name: "sets up a speed run's timed iterations; training to accuracy counts "
                "steps and epochs (--eval-every, --max-epochs, --time-budget) and measures "
                "no compute-only reference: leave it out"
                for name in cls.names() if (name, getattr(config, name)) != ("reference_iters", 0)}


@dataclass
class Timings:
    """One rank's samples of one measured phase."""

    iteration_seconds: List[float] = field(default_factory=list)
    batch_seconds: List[List[float]] = field(default_factory=list)  # [iteration][batch]
    loss: List[float] = field(default_factory=list)  # last batch of each iteration
    # the first step (from 1, warm-up included) whose loss was not finite, if any
    first_non_finite_step: Optional[int] = None


class LossWatch:
    """Counts a rank's training steps and remembers the first whose loss was not
    finite: a diverged run is still measured and recorded, and says where it diverged."""

    def __init__(self) -> None:
        self.steps = 0
        self.first_non_finite: Optional[int] = None

    def see(self, loss) -> float:
        """The loss as a float, counted; called after the step's device sync."""
        value = float(loss.detach())
        self.steps += 1
        if self.first_non_finite is None and not math.isfinite(value):
            self.first_non_finite = self.steps
        return value


def device_sync(device) -> Callable[[], None]:
    """Wait for queued GPU work, so the clock measures work done, not work queued."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def barrier() -> None:
    """All ranks meet; under NCCL on this rank's own GPU (torch guesses the device,
    and warns that it does, when it is not named)."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def warm_up(step: Callable[[], "object"], sync: Callable[[], None], batches: int,
            watch: Optional[LossWatch] = None) -> None:
    for _ in range(batches):
        loss = step()
        if watch is not None:
            watch.see(loss)  # waits for this step's loss, as a timed step's sync does
    sync()


def measure(step: Callable[[], "object"], sync: Callable[[], None], iterations: int,
            batches_per_iter: int,
            after_iteration: Optional[Callable[[int, Timings], None]] = None,
            recorder: Optional[Recorder] = None,
            watch: Optional[LossWatch] = None) -> Timings:
    """Time `iterations` iterations of `batches_per_iter` steps each.

    Each batch ends with a device sync so its own latency is known (as in
    PyTorch's DDP benchmark); after_iteration runs outside the timed region. With a
    recorder, each batch is a step span and the step's own spans are recorded. The
    watch (which may have counted the warm-up) sees every step's loss.
    """
    timings = Timings()
    watch = watch or LossWatch()
    for i in range(iterations):
        batches, losses = [], []
        start = time.perf_counter()
        for _ in range(batches_per_iter):
            loss, seconds = timed_step(step, sync, recorder)
            losses.append(loss.detach())
            batches.append(seconds)
        timings.iteration_seconds.append(time.perf_counter() - start)
        timings.batch_seconds.append(batches)
        # read after the clock stopped: on a GPU each read is a copy to the host
        timings.loss.append([watch.see(loss) for loss in losses][-1])
        timings.first_non_finite_step = watch.first_non_finite
        if after_iteration is not None:
            after_iteration(i, timings)
    return timings


def timed_step(step: Callable[[], "object"], sync: Callable[[], None],
               recorder: Optional[Recorder] = None) -> Tuple["object", float]:
    """One step, ended by a device sync: (its loss, its seconds). With a recorder it is
    a step span, and the spans its step records are kept."""
    with recorder.measured_step() if recorder is not None else contextlib.nullcontext():
        t0 = time.perf_counter()
        loss = step()
        sync()
        t1 = time.perf_counter()
        if recorder is not None:
            recorder.add("step", t0, t1)
    return loss, t1 - t0


def measure_phases(step: "TrainingStep", images, labels, batches: int) -> List[List[float]]:
    """Seconds of each phase of `batches` compute-only training steps, [batch][phase]
    in the order of spans.PHASES. The step is built with a device sync at the end of
    every phase, so the split is the device's, not the launch queue's; the syncs make
    these steps slower than unsplit ones, so only their shares are meaningful."""
    split = []
    for _ in range(batches):
        step(images, labels)
        seconds = {phase.kind: phase.end - phase.start for phase in step.phases}
        split.append([seconds[kind] for kind in PHASES])
    return split
