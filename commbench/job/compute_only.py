"""The compute-only reference of a run: training with no communication, measured in the
same job, so that in-job scaling efficiency E* and the communication overhead compare
the run with what the same workers compute on the same machine at the same time.

For that to hold, all workers measure it together and long enough: a barrier starts
each half, every worker runs the same number of iterations, chosen so that a half
lasts at least --reference-seconds (and holds at least half of --reference-iters), and
one half is measured before the run and one after it, so drift and start-up effects
show (metrics.summarize compares the halves and the workers' windows).

It also splits a few of its steps into forward, backward and optimizer phases: where
in a step communication can start (`commbench simulate` places it there).
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from typing import Any, Callable, Dict, List

from commbench.job.speed_loop import Timings, barrier, measure, measure_phases, warm_up
from commbench.timing.spans import PHASES
from commbench.job.training_step import TrainingStep


class ComputeOnly:
    """The reference on a copy of the model (the run starts from the state it would
    have started from anyway): build it, then call half() before and after the run."""

    def __init__(self, trainable: Callable[[Any], tuple], model, config, images, labels,
                 sync: Callable[[], None]):
        self.twin = copy.deepcopy(model)
        twin, optimizer = trainable(self.twin)
        step = TrainingStep(twin, optimizer, slowed=False)
        self.step = lambda: step(images, labels)
        self.sync, self.batches = sync, config.num_batches_per_iter
        warm_up(self.step, sync, config.num_warmup_batches)
        self.iterations = self._iterations_per_half(config)
        synced_step = TrainingStep(twin, optimizer, sync=sync, slowed=False)
        self.phase_seconds = measure_phases(synced_step, images, labels, self.batches)
        self.timings = Timings()
        self.windows: List[List[float]] = []  # [start, end] of each half, wall-clock

    def _iterations_per_half(self, config) -> int:
        """Enough iterations for --reference-seconds on the slowest worker, agreed by
        all, so that every worker's window covers the others'."""
        import torch
        import torch.distributed as dist

        fastest = math.inf
        for _ in range(self.batches):
            start = time.perf_counter()
            self.step()
            self.sync()
            fastest = min(fastest, time.perf_counter() - start)
        # The fastest batch, not the first: a slow first one would cut the half short.
        seconds = fastest * self.batches
        slowest = torch.tensor([seconds], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            slowest = slowest.cuda()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        wanted = config.reference_seconds / max(float(slowest), 1e-9)
        return max(math.ceil(config.reference_iters / 2), math.ceil(wanted))

    def half(self) -> None:
        """One half of the reference, all workers starting together."""
        barrier()
        start = time.time()
        done = measure(self.step, self.sync, self.iterations, self.batches)
        self.windows.append([start, time.time()])
        self.timings.iteration_seconds += done.iteration_seconds
        self.timings.batch_seconds += done.batch_seconds


def phase_medians(trainable: Callable[[Any], tuple], model, images, labels,
                  sync: Callable[[], None], batches: int = 5) -> Dict[str, float]:
    """This rank's median seconds of each compute phase (spans.PHASES) alone, with no
    communication, on a copy of the model: what a rank slowed on purpose
    (commbench.job.straggler) scales its idling by."""
    twin, optimizer = trainable(copy.deepcopy(model))
    step = TrainingStep(twin, optimizer, sync=sync, slowed=False)
    warm_up(lambda: step(images, labels), sync, 2)
    split = measure_phases(step, images, labels, batches)
    return {phase: float(statistics.median(row[i] for row in split))
            for i, phase in enumerate(PHASES)}
