"""Putting the front in place of Open MPI 5's mpirun and mpiexec (the real ones kept
beside it as `<name>.openmpi`), taking it out, and telling whether the `mpirun` on PATH
still needs it (missing_front)."""

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
# The installed front: a script that runs supervise.front under this environment's
# Python (it imports it from the package, the name installed fronts have always used).
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
