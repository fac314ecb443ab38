"""`commbench supervise --restarts N -- LAUNCHER ...`: run a job's launcher command and,
when it fails, run the whole command again, up to N times. For an MPI launcher it is
what torchrun's elastic agent (`torchrun --max-restarts N`) is for torchrun's workers:
the restarts of `--recovery restart` (commbench.faults.recovery), whose jobs resume from
their newest checkpoint.

A refused request (exit status 2, commbench's one-line usage errors) is not run again:
it would be refused again. Before a restart, a machine of an emulated cluster that
--fail cut off the network is waited for: the launcher could not reach it. The
launcher's environment says that a supervisor restarts it (so that `commbench run
--recovery restart` accepts it) and, from the second attempt on, when the supervisor
saw the previous attempt end: the failure's detection."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import List, Optional, Set

from commbench.cluster.namespaces import wait_for_machines
from commbench.config.flags import positive_int
from commbench.errors import UsageError
from commbench.faults.recovery import DETECTED, SUPERVISED


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--restarts", type=positive_int, required=True, metavar="N",
                        help="how many times to run the command again after it fails")
    parser.add_argument("launcher_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the launcher command of the job, e.g. mpiexec -n 4 python -m "
                        "commbench --recovery restart ...")


def main(args: argparse.Namespace) -> int:
    command = args.launcher_command
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("supervise: no command to run; give it after --, e.g. commbench "
                         "supervise --restarts 1 -- mpiexec -n 4 python -m commbench ...")
    env = dict(os.environ, **{SUPERVISED: str(args.restarts)})
    for attempt in range(args.restarts + 1):
        try:
            code = subprocess.run(command, env=env).returncode
        except OSError as error:
            raise UsageError(f"supervise: cannot run {command[0]}: {error.strerror}")
        if code in (0, UsageError.exit_code) or attempt == args.restarts:
            return code
        env[DETECTED] = repr(time.time())
        print(f"commbench supervise: the job ended with exit status {code}; starting it "
              f"again ({attempt + 1} of {args.restarts} restarts)", file=sys.stderr,
              flush=True)
        wait_for_machines("commbench supervise", hosts(command))
    return code


def hosts(command: List[str]) -> Optional[Set[str]]:
    """The machines an MPI launcher's command names (-H, -host, --host, --host=...),
    without their slots; None where it names none."""
    named = [value for flag, value in zip(command, command[1:])
             if flag in ("-H", "-host", "--host")]
    named += [arg.split("=", 1)[1] for arg in command if arg.startswith("--host=")]
    found = {host.split(":")[0] for value in named for host in value.split(",")}
    return found or None

