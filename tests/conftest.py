"""Tests not marked `mpi` start no job: `python -m pytest -m "not mpi"` runs no launcher
and no multi-rank process. A guard enforces it: in such a test, starting a launcher
(or a sweep, which starts launchers) fails the test at once, naming what it tried."""

import os
import subprocess

import pytest

LAUNCHERS = {"mpiexec", "mpirun", "orterun", "prterun", "torchrun", "horovodrun", "bfrun",
             "srun"}


def starts_a_job(argv) -> bool:
    """Whether a command line starts ranks: a launcher, torch's launcher module, or a
    `commbench sweep` that is not a dry run."""
    args = [str(a) for a in ([argv] if isinstance(argv, (str, bytes, os.PathLike)) else argv)]
    if not args:
        return False
    if os.path.basename(args[0]) in LAUNCHERS or "torch.distributed.run" in args:
        return True
    commbench = "commbench" in args and args.index("commbench") > 0 \
        and args[args.index("commbench") - 1] == "-m"
    return commbench and "sweep" in args and "--dry-run" not in args


@pytest.fixture(autouse=True)
def no_jobs_unless_marked_mpi(request, monkeypatch):
    if request.node.get_closest_marker("mpi") is not None:
        yield
        return
    popen_init = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kw):
        if starts_a_job(args):
            raise AssertionError(f"a test not marked `mpi` started a job: {args}")
        popen_init(self, args, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield
