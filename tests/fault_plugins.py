"""Strategies that break on purpose mid-run, loaded by dotted path in the failure
tests: the faults are real (a signal, an exception), only the trigger is staged."""

import os
import signal
import time

from commbench.optimizers.allreduce import Allreduce
from commbench.optimizers.neighbor_allreduce import NeighborAllreduce

FAULTY_RANK = 1
FAULTY_STEP = 4  # inside the timed iterations of tests.launchers.TINY_RUN
FAULT_MARK = "COMMBENCH_TEST_FAULT_MARK"  # a file the faulty rank writes the time into


class _Faulty:
    """Mixed into a strategy: its rank 1 breaks at its 4th step."""

    def wrap(self, model, optimizer):
        step = super().wrap(model, optimizer)
        count = [0]

        def faulty(images, labels):
            count[0] += 1
            if self.ctx.rank == FAULTY_RANK and count[0] == FAULTY_STEP:
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


class StoppedNeighbor(_Faulty, NeighborAllreduce):
    """The same silence in a neighbor exchange (its MPI transport under mpiexec)."""

    name = "stopped_neighbor"
    fault = Stopped.fault


SLOW_SECONDS = 0.5  # far above what a loaded machine's scheduling adds to a step


class _Slow:
    """Mixed into a strategy: its rank 1 sleeps before every step's forward pass (a
    straggler the others must wait for)."""

    def wrap(self, model, optimizer):
        step = super().wrap(model, optimizer)

        def slow(images, labels):
            if self.ctx.rank == FAULTY_RANK:
                time.sleep(SLOW_SECONDS)
            return step(images, labels)

        return slow


class SlowAllreduce(_Slow, Allreduce):
    name = "slow_allreduce"


class SlowNeighbor(_Slow, NeighborAllreduce):
    name = "slow_neighbor"
