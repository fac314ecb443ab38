"""Firing the failures of --fail (commbench.faults.fail_schedule) on the rank they name: the
job hands each training step to `Injector.around`, and before the step that an event
names (or the first one after its time) the rank says so in one line and kills or stops
itself with a real signal, or takes its emulated machine's link down, so that its peers
and the launcher meet a real failure.

With no recovery policy, a killed rank ends the job within seconds, through the
launcher, as any lost rank does (commbench.job.failure); a stopped one is ended by its
peers' --timeout; a cut machine by mpirun, which loses its daemon there, or by the
peers' --timeout, whichever comes first (commbench.launch.lost_machine); its link comes
back after +REJOIN or, without one, once the rank's process has ended (cut_link).
Under --recovery restart the launcher then starts the job again
(commbench.faults.restart), which is told of each event before it fires, so that the
restarted job never fires it again. The line says the failure was injected, so that
nobody hunts for a bug, and when, on the wall clock, so that the time to its detection
can be read off the launcher's end."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, TypeVar

from commbench.faults.fail_schedule import FailEvent, schedule

T = TypeVar("T")
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


class Injector:
    """This rank's events of the schedule; `around(step)` is the step that fires them."""

    def __init__(self, events: Sequence[FailEvent], rank: int, spec: str, timeout: float,
                 clock: Callable[[], float] = time.monotonic,
                 die: Callable[[int], None] = lambda sig: os.kill(os.getpid(), sig),
                 # a lambda: cut_link is defined below the class
                 cut: Callable[[FailEvent], None] = lambda event: cut_link(event)) -> None:
        self.mine = [e for e in events if e.rank == rank]
        self.rank, self.spec, self.timeout = rank, spec, timeout
        self.clock, self.die, self.cut = clock, die, cut
        self.steps = 0
        self.began: Optional[float] = None
        # Under --recovery restart (commbench.faults.restart): told of each event as it
        # fires, before the rank dies, so that the job started again never fires it.
        self.record: Optional[Callable[[FailEvent, int], None]] = None
        # Under --recovery gossip and torchft: the others go on without it.
        self.survived = False

    def forget(self, fired: Sequence[FailEvent]) -> None:
        """Events that fired in an earlier attempt of the job: never again."""
        self.mine = [e for e in self.mine if e not in fired]

    def resume_at(self, steps: int, training_seconds: float) -> None:
        """Count steps and time on from where a restarted job resumed."""
        self.steps = steps
        self.began = self.clock() - training_seconds

    def around(self, step: Callable[..., T]) -> Callable[..., T]:
        """step, with this rank's failures fired before the step they are due at."""
        if not self.mine:
            return step

        def stepped(*args, **kwargs) -> T:
            self.before_step()
            return step(*args, **kwargs)

        return stepped

    def before_step(self) -> None:
        self.steps += 1
        now = self.clock()
        if self.began is None:
            self.began = now
        for event in self.mine:
            if event.step == self.steps or (event.seconds is not None
                                            and now - self.began >= event.seconds):
                self.mine.remove(event)
                self.fire(event, now - self.began)
                return

    def fire(self, event: FailEvent, elapsed: float) -> None:
        if self.record is not None:
            self.record(event, self.steps - 1)
        print(f"commbench: error: rank {self.rank}: {self.line(event, elapsed)}",
              file=sys.stderr, flush=True)
        if event.kind == "cut":
            self.cut(event)
        else:
            self.die(SIGNALS[event.kind])

    def line(self, event: FailEvent, elapsed: float) -> str:
        """What the rank says as it fails: that --fail did it, at which step and when."""
        at = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        return (f"failure injected by --fail ({event}), not a bug: it {self.what(event)}; at "
                f"step {self.steps}, {elapsed:.2f} s into training, {at} UTC")

    def what(self, event: FailEvent) -> str:
        """What the rank does, and what follows."""
        restarts = " and the launcher starts it again" if self.record is not None else ""
        if event.kind == "kill":
            ends = ("the others go on without it" if self.survived else
                    "the launcher starts the job again" if self.record is not None else
                    "the job ends")
            return f"kills itself (SIGKILL); {ends} now"
        if event.kind == "cut":
            back = (f"; its link comes back {event.rejoin:g} s later" if event.rejoin else
                    "; its link comes back when this process has ended")
            found = ("the others go on without it once they find it lost" if self.survived
                     else "the job ends when mpirun loses its daemon there or after "
                     f"--timeout ({self.timeout:g} s){restarts}")
            return f"takes its machine's link down: alive, but nothing on the machine is " \
                f"reachable; {found}{back}"
        if self.survived:
            return (f"stops itself (SIGSTOP) and answers no one; after --timeout "
                    f"({self.timeout:g} s) the others go on without it")
        return (f"stops itself (SIGSTOP) and answers no one; the others end the job after "
                f"--timeout ({self.timeout:g} s){restarts}")


def cut_link(event: FailEvent) -> None:
    """This rank's machine off its emulated network: its NIC down in the machine's network
    namespace, where this process runs (commbench.cluster). A shell in a session of its
    own takes it up again after +REJOIN or, without one, once this process has ended
    (the job is over with it), so that the machine is whole for the next job."""
    from commbench.result.environment import emulated_network

    nic = str((emulated_network() or {}).get("nic"))
    wait = (f"sleep {event.rejoin:.3f}" if event.rejoin is not None else
            f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 0.2; done")
    subprocess.Popen(["sh", "-c", f'{wait}; exec ip link set dev "$0" up', nic],
                     start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "link", "set", "dev", nic, "down"], check=True,
                   stdin=subprocess.DEVNULL, capture_output=True)


def injector(spec: str, world_size: int, rank: int, timeout: float) -> Injector:
    """The injector of this rank in a job of world_size ranks."""
    return Injector(schedule(spec, world_size), rank, spec, timeout)


def describe(spec: str, world_size: int) -> str:
    """How the console names the schedule: `rank 1 killed at step 4, rank 2 stopped
    after 45 s`."""
    done = {"kill": "killed", "stop": "stopped", "cut": "cut off (its machine's link)"}
    return ", ".join(f"rank {e.rank} {done[e.kind]} "
                     + (f"at step {e.step}" if e.step is not None else f"after {e.seconds:g} s")
                     for e in schedule(spec, world_size))


def facts(spec: str, world_size: int) -> Optional[Dict[str, Any]]:
    """What a result records of the schedule (None without one): the spec and its events.
    A result written without a recovery policy had none of them fire: a failure that
    fires ends the job."""
    if spec == "none":
        return None
    events: List[Dict[str, Any]] = [e.to_dict() for e in schedule(spec, world_size)]
    return {"spec": spec, "events": events}
