"""Start commands through real launchers (mpiexec, torchrun) with a hard timeout.

On timeout the whole process group is killed, so no rank outlives its test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

PYTHON = sys.executable
BIN = Path(PYTHON).parent


def launcher_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    # Open MPI refuses to run as root without these (CI runs as root).
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONUNBUFFERED="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # a test must see only its own launcher's variables
    env.update(extra or {})
    return env


def run(cmd: List[str], timeout: float, env: Optional[Dict[str, str]] = None,
        cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """Run cmd; past `timeout` seconds kill it and everything it started, and fail."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=launcher_env(env), cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{out[-3000:]}\n{err[-3000:]}")
    except BaseException:  # pytest-timeout's or a user's interrupt: leave no rank behind
        kill_tree(proc.pid)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def kill_tree(root: int) -> None:
    """SIGKILL root and all its descendants. Not only its process group: Open MPI 5
    and horovodrun's gloo controller start ranks in process groups (or sessions) of
    their own."""
    children: Dict[int, List[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [root], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def only_result(directory: Path) -> dict:
    """The one result file a job wrote into directory, parsed."""
    import json

    files = list(directory.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def mpiexec_path() -> str:
    path = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
    if path is None:
        pytest.fail("mpiexec not found: install the mpi extra (pip install -e '.[mpi,test]')")
    return path


# Failures of the machine, not of the job, after which starting it again is the same
# test: Open MPI 5's launcher sometimes fails to start its PMIx server (a race in PMIx's
# start-up, also seen in other projects' CI) before any rank exists, and the dynamic
# loader can be refused the memory map of a shared library (seen once in CI on a
# freshly installed scipy extension), and a port found free can be taken by another
# process before the job binds it. Nothing else is retried.
MACHINE_FAILURES = ("The PMIx server's listener thread failed to start",
                    "failed to map segment from shared object", "EADDRINUSE")


def run_once_more_if_the_machine_failed(cmd: List[str], timeout: float,
                                        **kw) -> subprocess.CompletedProcess:
    done = run(cmd, timeout, **kw)
    if done.returncode != 0 and any(f in done.stderr for f in MACHINE_FAILURES):
        done = run(cmd, timeout, **kw)
    return done


def mpiexec(n: int, args: List[str], timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    """`mpiexec -n N python ARGS...` (oversubscribed: CI has 2 cores)."""
    cmd = [mpiexec_path(), "-n", str(n), "--oversubscribe", "--bind-to", "none", PYTHON, *args]
    return run_once_more_if_the_machine_failed(cmd, timeout, **kw)


def torchrun(n: int, args: List[str], timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]
    return run_once_more_if_the_machine_failed(cmd, timeout, **kw)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A run that takes seconds, not minutes, on 2 CPU cores.
TINY_RUN = ["--model", "resnet18", "--image-size", "32", "--batch-size", "8",
            "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "3",
            "--reference-iters", "1", "--reference-seconds", "0"]
