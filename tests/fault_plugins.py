"""Strategies that break on purpose mid-run, loaded by dotted path in the failure
tests: the faults are real (a signal, an exception), only the trigger is staged."""

import errno
import os
import signal
import time

from commbench.optimizers.allreduce import Allreduce
from commbench.optimizers.neighbor_allreduce import NeighborAllreduce

FAULTY_RANK = 1
FAULTY_STEP = 4  # inside the timed iterations of tests.launchers.TINY_RUN
FAULT_MARK = "COMMBENCH_TEST_FAULT_MARK"  # a file the faulty rank writes the time into


class _Faulty:
    """Mixed into a strategy: its rank 1 (faulty_rank) breaks at its 4th step."""

    faulty_rank = FAULTY_RANK

    def wrap(self, model, optimizer):
        step = super().wrap(model, optimizer)
        count = [0]

        def faulty(images, labels):
            count[0] += 1
            if self.ctx.rank == self.faulty_rank and count[0] == FAULTY_STEP:
                mark = os.environ.get(FAULT_MARK)
                if mark:  # when, on the clock every process shares, the fault began
                    with open(mark, "w") as f:
                        f.write(repr(time.monotonic()))
                self.fault()
            return step(images, labels)

        return faulty


class Killed(_Faulty, Allreduce):
    name = "killed"

    def fault(self):
        os.kill(os.getpid(), signal.SIGKILL)


class Raises(_Faulty, Allreduce):
    name = "raises"

    def fault(self):
        raise ValueError("injected failure")


class Stopped(_Faulty, Allreduce):
    name = "stopped"

    def fault(self):
        os.kill(os.getpid(), signal.SIGSTOP)  # alive but silent: only a timeout ends this


FILL = "COMMBENCH_TEST_FILL"  # a folder whose file system fills_the_disk fills


class FillsTheDisk(_Faulty, Allreduce):
    """Rank 0 fills the file system of the folder FILL names in the middle of the run,
    after start-up checked its free space: the result's write then finds it full."""

    name = "fills_the_disk"
    faulty_rank = 0

    def fault(self):
        with open(os.path.join(os.environ[FILL], "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"x" * 65536)
                    f.flush()
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise


class StoppedNeighbor(_Faulty, NeighborAllreduce):
    """The same silence in a neighbor exchange (its MPI transport under mpiexec)."""

    name = "stopped_neighbor"
    fault = Stopped.fault


# The straggler's delay: at least SLOW_SECONDS, and SLOW_STEPS times the median step it
# measured so far, so that it stays far above what load adds to the others' compute
# however slow the machine is today (at most MAX_SLOW_SECONDS).
SLOW_SECONDS = 0.5
SLOW_STEPS = 3.0
MAX_SLOW_SECONDS = 5.0
SLOW_LOG = "COMMBENCH_TEST_SLOW_LOG"  # a file the slow rank writes each delay into


class _Slow:
    """Mixed into a strategy: its rank 1 sleeps before every step's forward pass (a
    straggler the others must wait for)."""

    def wrap(self, model, optimizer):
        step = super().wrap(model, optimizer)
        took = []

        def slow(images, labels):
            if self.ctx.rank == FAULTY_RANK:
                seconds = straggler_delay(took)
                log = os.environ.get(SLOW_LOG)
                if log:
                    with open(log, "a") as f:
                        f.write(f"{seconds!r}\n")
                time.sleep(seconds)
            began = time.perf_counter()
            done = step(images, labels)
            took.append(time.perf_counter() - began)
            return done

        return slow


def straggler_delay(steps) -> float:
    """The next delay, from the steps (seconds) this rank measured before it."""
    if not steps:
        return SLOW_SECONDS
    median = sorted(steps)[len(steps) // 2]
    return min(max(SLOW_SECONDS, SLOW_STEPS * median), MAX_SLOW_SECONDS)


class SlowAllreduce(_Slow, Allreduce):
    name = "slow_allreduce"


class SlowNeighbor(_Slow, NeighborAllreduce):
    name = "slow_neighbor"
