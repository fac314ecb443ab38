"""What a rank does when something unexpected breaks: say so in one line that names
the rank, then end the whole job at once instead of leaving peers waiting.

One exception to "at once": a rank that got no answer from a peer under Open MPI 5's
mpirun, with peers on other machines, first gives mpirun LOST_MACHINE_SECONDS to notice
a lost machine (see launcher_first)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
import traceback
from typing import Dict, Iterator, Optional, Tuple

# Open MPI 5's launcher (PRRTE) learns that a machine stopped answering (its network
# went down or stalled, or everything on it died) from the TCP keepalive of its
# connection to the daemon there: with PRRTE's defaults (300 s idle, then 9 probes 20 s
# apart) after 8 minutes, with these settings of its OOB after at most 20 s.
# `commbench setup-mpirun` writes them into PRRTE's default parameter file.
PRRTE_KEEPALIVE = (("oob_tcp_keepalive_time", 5), ("oob_tcp_keepalive_intvl", 3),
                   ("oob_tcp_keepalive_probes", 5))
LOST_MACHINE_SECONDS = 5 + 5 * 3
NO_ANSWER = re.compile(r"\btime[ds]?[ _-]?out|ETIMEDOUT", re.IGNORECASE)


def describe_and_abort(error: BaseException) -> None:
    from commbench.launch.detect import detect_launch

    try:
        rank = detect_launch().rank
    except Exception:
        rank = "?"
    text = str(error).strip().splitlines()
    detail = text[0] if text else ""
    print(f"commbench: error: rank {rank}: {type(error).__name__}: {detail}",
          file=sys.stderr, flush=True)
    if os.environ.get("COMMBENCH_DEBUG"):
        traceback.print_exception(type(error), error, error.__traceback__)
    time.sleep(launcher_first(error))
    _abort(1)


def launcher_first(error: BaseException, environ=os.environ) -> float:
    """Seconds to leave mpirun before this rank ends the job itself: after no answer
    from a peer, under Open MPI with ranks on other machines, LOST_MACHINE_SECONDS and
    5 more; otherwise none.

    If the silent peer's machine is lost, mpirun's keepalive notices within
    LOST_MACHINE_SECONDS, ends the job and names the machine. An abort sent first would
    never end: mpirun orders every daemon, the lost one too, to kill its ranks, and TCP
    sends no keepalive while data is unacknowledged, so mpirun waits for the kernel to
    give up retransmitting (about 15 minutes) and ignores a first SIGTERM meanwhile.
    When the peer's machine still answers, the abort follows the pause."""
    if not (isinstance(error, TimeoutError) or NO_ANSWER.search(str(error))):
        return 0.0
    try:
        spread = int(environ["OMPI_COMM_WORLD_LOCAL_SIZE"]) < int(environ["OMPI_COMM_WORLD_SIZE"])
    except (KeyError, ValueError):
        return 0.0
    return LOST_MACHINE_SECONDS + 5.0 if spread else 0.0


def _abort(code: int) -> None:
    # Under MPI a normal exit would enter MPI_Finalize, which waits for every peer:
    # Abort makes the launcher kill all ranks now.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() \
            and mpi.COMM_WORLD.Get_size() > 1:
        mpi.COMM_WORLD.Abort(code)
    sys.stderr.flush()
    # Skip interpreter teardown: process-group destructors can block on dead peers.
    os._exit(code)


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
