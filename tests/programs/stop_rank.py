"""`python stop_rank.py RANK WHEN commbench-args...`: `python -m commbench args...`, except
that rank RANK stops itself (SIGSTOP: alive but silent) during start-up, for the
start-up deadline tests.

WHEN is a number of seconds after launch (a timer thread, while the main thread is
still importing), or the point of start-up just before which the rank stops:
`mpi-init`, `mpi-roll-call` (after MPI's initialisation), `store-roll-call` (before it
reports to torch.distributed's store), `process-group` (after the roll call, before the
process group) or `first-collective` (after the process group).
When STOP_MARK names a file, the rank writes into it when it stopped (time.monotonic(),
the clock every process of the machine shares)."""

import os
import runpy
import signal
import sys
import threading
import time

STOP_MARK = "COMMBENCH_TEST_STOP_MARK"


def stop() -> None:
    if os.environ.get(STOP_MARK):
        with open(os.environ[STOP_MARK], "w") as mark:
            mark.write(repr(time.monotonic()))
    os.kill(os.getpid(), signal.SIGSTOP)


def stop_before(module, name: str) -> None:
    original = getattr(module, name)

    def stopped_first(*args, **kwargs):
        stop()
        return original(*args, **kwargs)

    setattr(module, name, stopped_first)


def stop_after(module, name: str) -> None:
    original = getattr(module, name)

    def stopped_after(*args, **kwargs):
        result = original(*args, **kwargs)
        stop()
        return result

    setattr(module, name, stopped_after)


def arm(when: str) -> None:
    if when.replace(".", "", 1).isdigit():
        timer = threading.Timer(float(when), stop)
        timer.daemon = True
        timer.start()
        return
    from commbench.launch import distributed, rendezvous

    if when == "mpi-init":
        stop_before(rendezvous, "_start_mpi")
    elif when == "mpi-roll-call":
        stop_after(rendezvous, "_start_mpi")
    elif when == "store-roll-call":
        stop_before(distributed, "_roll_call")
    elif when == "process-group":
        stop_after(distributed, "_roll_call")
    elif when == "first-collective":
        stop_before(distributed, "_exchange_hosts")
    else:
        sys.exit(f"stop_rank.py: unknown point {when!r}")


def my_rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


if __name__ == "__main__":
    rank, when, *args = sys.argv[1:]
    if my_rank() == int(rank):
        arm(when)
    sys.argv = ["commbench", *args]
    runpy.run_module("commbench", run_name="__main__", alter_sys=True)
