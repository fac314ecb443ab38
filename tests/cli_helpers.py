"""`commbench ARGS...` called in the test's own process, through the CLI's entry point
(commbench.cli.main): what `python -m commbench ARGS...` would print and exit with, in
milliseconds instead of the seconds a new Python process takes to import torch.

Only for commands that start no job: readers (report, plot, compare, simulate, list),
--help, `sweep --dry-run`, and flags that are refused. A `run` that passes its checks
would start torch.distributed in the test's process: here it fails the test instead,
before anything starts. Such runs belong in `job` tests, with a real process."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
from pathlib import Path
from typing import Dict, Optional, Union
from unittest import mock


class StartedAJob(AssertionError):
    """A command called in-process went on to start torch.distributed."""


def _would_start_a_job(*args, **kwargs):
    raise StartedAJob("an in-process `commbench run` passed its checks and would start a "
                      "job in the test's process: test it in a `job` test, with a process")


def _reraise(error: BaseException) -> None:
    # commbench's last resort (one line, then os._exit) would end pytest itself: the
    # test fails with the error and its traceback instead.
    raise error


def commbench(*args: Union[str, Path], env: Optional[Dict[str, str]] = None,
              cwd: Optional[Union[str, Path]] = None) -> subprocess.CompletedProcess:
    """Run `commbench ARGS...` in this process: (returncode, stdout, stderr) as
    subprocess.run(..., capture_output=True, text=True) would give them. `env` adds to
    the environment for the call; `cwd` is the directory it runs in."""
    from commbench import cli
    from commbench.job import failure
    from commbench.launch import distributed

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    # As in a process whose output is a pipe: argparse wraps help at 80 columns.
    extra = {"COLUMNS": os.environ.get("COLUMNS", "80"), **(env or {})}
    sigterm = signal.getsignal(signal.SIGTERM)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, extra))
        stack.enter_context(mock.patch.object(distributed, "init_distributed",
                                              _would_start_a_job))
        stack.enter_context(mock.patch.object(failure, "describe_and_abort", _reraise))
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd) if hasattr(contextlib, "chdir")
                                else _chdir(cwd))
        stack.callback(signal.signal, signal.SIGTERM, sigterm)
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            cli.main(argv)
            code = 0  # main ends every command with SystemExit; be lenient if not
        except SystemExit as ended:
            code = _exit_status(ended.code, err)
    return subprocess.CompletedProcess(["commbench", *argv], code, out.getvalue(),
                                       err.getvalue())


def refused(*args: Union[str, Path]) -> str:
    """The one line `commbench ARGS...` refuses them with, exit status 2."""
    done = commbench(*args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    return lines[0]


def _exit_status(code, err: io.StringIO) -> int:
    """The status a process would exit with after SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=err)
    return 1


@contextlib.contextmanager
def _chdir(path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)
