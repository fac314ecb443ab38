"""The test tiers, and the guard that keeps each test in its tier.

- fast (`-m "not job and not mpi"`): starts no process but cheap tools (git, bash -n,
  make -n); commands are called in-process through the CLI's entry point
  (cli_helpers.commbench).
- job (`-m "job and not mpi"`): starts Python processes (`python -m commbench`, pip,
  `python -c`) but no launcher and no multi-rank process.
- mpi (`-m mpi`): starts jobs through a real launcher.

A guard enforces it: a test not marked `mpi` that starts a launcher (or a sweep, which
starts launchers), or a test marked neither `job` nor `mpi` that starts a Python
process, fails at once, naming what it tried."""

import os
import shlex
import subprocess
import sys

import pytest

LAUNCHERS = {"mpiexec", "mpirun", "orterun", "prterun", "torchrun", "horovodrun", "bfrun",
             "srun"}
# Programs that are Python processes under another name: the project's own command and pip.
PYTHON_PROGRAMS = {"commbench", "pip", "pip3"}


def _argv(argv):
    if isinstance(argv, (str, bytes, os.PathLike)):
        text = os.fsdecode(argv)
        try:
            return shlex.split(text)  # a shell=True line, or one program
        except ValueError:
            return [text]
    return [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]


def starts_a_job(argv) -> bool:
    """Whether a command line starts ranks: a launcher, torch's launcher module, or a
    `commbench sweep` that is not a dry run."""
    args = _argv(argv)
    if not args:
        return False
    if os.path.basename(args[0]) in LAUNCHERS or "torch.distributed.run" in args:
        return True
    commbench = "commbench" in args and args.index("commbench") > 0 \
        and args[args.index("commbench") - 1] == "-m"
    return commbench and "sweep" in args and "--dry-run" not in args


def starts_python(argv) -> bool:
    """Whether a command line starts a Python process: this interpreter, any `python*`,
    `commbench` or pip, or `-m commbench`."""
    args = _argv(argv)
    if not args:
        return False
    program = os.path.basename(args[0])
    return (args[0] == sys.executable or program.startswith("python")
            or program in PYTHON_PROGRAMS
            or any(a == "-m" and b == "commbench" for a, b in zip(args, args[1:])))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The groups the mpi tier's two pytest-xdist workers take whole (`make test`: -n 2
    --dist loadgroup): a file's tests stay together, where a file's fixtures start a job
    once; and every file checking strategies (tests/programs/check_strategies.py) joins
    one group, since one job per world size checks them all, once per worker."""
    for item in items:
        module = getattr(item, "module", None)
        checks = hasattr(module, "assert_strategy_clean")
        item.add_marker(pytest.mark.xdist_group("strategy-checks" if checks
                                                else getattr(module, "__name__", "")))


@pytest.fixture(autouse=True)
def processes_only_in_their_tier(request, monkeypatch):
    if request.node.get_closest_marker("mpi") is not None:
        yield
        return
    job = request.node.get_closest_marker("job") is not None
    popen_init = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kw):
        if starts_a_job(args):
            raise AssertionError(f"a test not marked `mpi` started a job: {args}")
        if not job and starts_python(args):
            raise AssertionError(f"a test marked neither `job` nor `mpi` started a Python "
                                 f"process: {args}")
        popen_init(self, args, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield


@pytest.fixture
def one_worker(tmp_path):
    """A process group of this test's process alone (gloo, world size 1): a strategy's
    step taken in-process, with what `wrap` needs of the launcher's context."""
    import types

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0,
                            world_size=1)
    yield types.SimpleNamespace(rank=0, world_size=1)
    dist.destroy_process_group()


@pytest.fixture
def recorder():
    """A recorder inside a measured step, as the loop runs each."""
    from commbench.timing import spans

    with spans.Recorder().measured_step() as recorder:
        yield recorder
