"""What a rank does when something unexpected breaks: say so in one line that names
the rank, then end the whole job at once instead of leaving peers waiting.

One exception to "at once": a rank that got no answer from a peer under Open MPI 5's
mpirun, with peers on other machines, first gives mpirun time to notice a lost machine
(launcher_first, of the lost-machine policy in commbench.launch.lost_machine).

Start-up has its own line (startup_failed): which ranks did not arrive, where the rank
that waited for them can know it."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import traceback
from typing import Callable, Dict, Iterable, Iterator, Optional, Sequence, Tuple

from commbench.launch.lost_machine import launcher_first

# How much longer than --timeout a rank waits for rank 0's answer at a start-up roll
# call: rank 0, which waits --timeout for everyone, must give up first, since only it
# can name the ranks that did not arrive.
ROLL_CALL_GRACE = 10.0


# Called as a rank finds something broken, before the job ends: a recovery policy that
# restarts the job records when its survivors knew of a failure (commbench.faults.restart),
# which can be well before the launcher restarts it. One policy a process: the newest.
on_failure: Optional[Callable[[], None]] = None


def describe_and_abort(error: BaseException) -> None:
    from commbench.launch.detect import who

    print(f"commbench: error: {who()}: {what_failed(error)}", file=sys.stderr, flush=True)
    if on_failure is not None:
        with contextlib.suppress(Exception):
            on_failure()
    if os.environ.get("COMMBENCH_DEBUG"):
        traceback.print_exception(type(error), error, error.__traceback__)
    time.sleep(launcher_first(error))
    _abort(1)


def what_failed(error: BaseException) -> str:
    """`Type: first line of the message`. A DataLoader worker's error arrives as "Caught
    Type in DataLoader worker process N." above the worker's traceback, whose last line
    is the error itself (an unreadable image, named): that line instead."""
    text = str(error).strip().splitlines()
    if text and text[0].startswith("Caught ") and "Original Traceback" in str(error):
        return text[-1].strip()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def describe_without_rank(error: BaseException) -> str:
    """The line for a command that is no job's rank (plot, report, ...): a file's error
    names the file and why, as the user can act on it; another its type and first line."""
    if os.environ.get("COMMBENCH_DEBUG"):
        traceback.print_exception(type(error), error, error.__traceback__)
    if isinstance(error, OSError) and error.filename is not None:
        paths = " -> ".join(str(p) for p in (error.filename, error.filename2) if p is not None)
        return f"{paths}: {error.strerror or error}"
    return what_failed(error)


def _abort(code: int, mpi_usable: bool = True) -> None:
    # Under MPI a normal exit would enter MPI_Finalize, which waits for every peer:
    # Abort makes the launcher kill all ranks now. Not while another thread is inside
    # MPI's initialisation, which MPI forbids: then the exit itself ends the job.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi_usable and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() \
            and mpi.COMM_WORLD.Get_size() > 1:
        mpi.COMM_WORLD.Abort(code)
    if not mpi_usable and mpi is not None:
        _abort_through_pmix(mpi, code)
    sys.stderr.flush()
    # Skip interpreter teardown: process-group destructors can block on dead peers.
    os._exit(code)


PMIX_ABORT_SECONDS = 5.0


def _abort_through_pmix(mpi, code: int) -> None:
    """Ask the launcher to end the whole job through PMIx, as MPI_Abort itself does,
    while MPI's initialisation still waits: the exit of one rank inside it does not
    always make Open MPI's launcher end the others. Given PMIX_ABORT_SECONDS on a
    thread of its own, since the launcher may not answer; without PMIx (another MPI),
    the exit alone."""
    import ctypes

    try:
        pmix_abort = ctypes.CDLL(mpi.__file__).PMIx_Abort
    except (OSError, AttributeError):
        return
    pmix_abort.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    asking = threading.Thread(target=pmix_abort, args=(code, b"commbench: start-up", None, 0),
                              daemon=True, name="commbench-pmix-abort")
    asking.start()
    asking.join(PMIX_ABORT_SECONDS)


class MpiDeadline:
    """MPI waits have no timeout of their own (torch.distributed's do): a peer that
    stops answering would hang the job for ever. Blocking MPI calls run inside
    `mpi_deadline.watch(what)`; once init_distributed has set `seconds` (--timeout),
    a daemon thread ends the job through describe_and_abort when one outlasts it."""

    def __init__(self) -> None:
        self.seconds: Optional[float] = None
        self._watched: Dict[int, Tuple[float, str]] = {}  # thread id -> (deadline, what)
        self._guard_started = threading.Lock()
        self._guard: Optional[threading.Thread] = None

    @contextlib.contextmanager
    def watch(self, what: str) -> Iterator[None]:
        if self.seconds is None:
            yield
            return
        self._start_guard()
        me = threading.get_ident()
        self._watched[me] = (time.monotonic() + self.seconds, what)
        try:
            yield
        finally:
            del self._watched[me]

    def _start_guard(self) -> None:
        with self._guard_started:
            if self._guard is None:
                self._guard = threading.Thread(target=self._end_overdue, daemon=True,
                                               name="commbench-mpi-deadline")
                self._guard.start()

    def _end_overdue(self) -> None:
        while True:
            now = time.monotonic()
            for thread, entry in list(self._watched.items()):
                # Compare the entry itself, not only its time: the wait may have ended
                # and a new one begun since the copy above.
                if entry[0] < now and self._watched.get(thread) is entry:
                    describe_and_abort(TimeoutError(
                        f"{entry[1]} got no answer from a peer for {self.seconds:g} s "
                        "(--timeout)"))
            time.sleep(min(1.0, (self.seconds or 4.0) / 4))


mpi_deadline = MpiDeadline()


def startup_failed(message: str, mpi_usable: bool = True) -> None:
    """End the job from start-up with one line, `commbench: error: rank R (host): ...`.

    Start-up has no result to lose and no traceback to show: what the user needs is which
    rank did not arrive, and on which machine, so that is what `message` says."""
    from commbench.launch.detect import detect_launch

    try:
        rank = detect_launch().rank
    except Exception:
        rank = "?"
    print(f"commbench: error: rank {rank} ({socket.gethostname()}): start-up: {message}",
          file=sys.stderr, flush=True)
    time.sleep(launcher_first(TimeoutError()))
    _abort(1, mpi_usable)


def name_ranks(ranks: Iterable[int], hosts: Sequence[Optional[str]] = (),
               most: int = 8) -> str:
    """`rank 3`, `ranks 1, 3 (host-b)`: the ranks, with their machines where known; past
    `most` of them, the first few and how many in all, so that it stays one line."""
    ranks = sorted(ranks)
    named = [f"{r} ({hosts[r]})" if r < len(hosts) and hosts[r] else str(r)
             for r in ranks[:most]]
    more = f", ... ({len(ranks)} in all)" if len(ranks) > most else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(named) + more


def patience_for_rank_0(timeout: float) -> float:
    """How long a rank waits for rank 0's answer at a start-up roll call: --timeout, the
    grace that leaves rank 0 to report first, and the pause rank 0 may leave mpirun."""
    return timeout + ROLL_CALL_GRACE + launcher_first(TimeoutError())


@contextlib.contextmanager
def startup_wait(seconds: float, message: str, mpi_usable: bool = True) -> Iterator[None]:
    """End the job with `message` (startup_failed) if the block has not finished within
    `seconds`: for a start-up wait on the other ranks that has no timeout of its own.

    The check runs on a timer thread, so the block must release the GIL while it waits
    (as a ctypes call does)."""
    overdue = _Overdue(message, mpi_usable)
    timer = threading.Timer(seconds, overdue.end_job)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        overdue.cancel()
        timer.cancel()


class _Overdue:
    """The end of one start-up wait: whichever comes first, the wait's end or its
    deadline; a wait that ends while the job is being ended waits for that end."""

    def __init__(self, message: str, mpi_usable: bool) -> None:
        self.message = message
        self.mpi_usable = mpi_usable
        self._decided = threading.Lock()
        self._finished = False

    def end_job(self) -> None:
        with self._decided:
            if not self._finished:
                startup_failed(self.message, self.mpi_usable)

    def cancel(self) -> None:
        with self._decided:
            self._finished = True
