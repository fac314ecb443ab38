"""A sweep's jobs under a recovery policy (`--recovery`, commbench.faults.recovery): the
launcher line each policy needs, as a user would type it by hand (docs/run.md, "Failures
on purpose"), and each job checked as `commbench run` would check it under that line.

- restart: the launcher starts the job again after each failure of its --fail schedule
  for its world size (at least once): `commbench supervise --restarts K --` around
  mpiexec or an emulated cluster's mpirun, `--max-restarts K` on torchrun's line.
- gossip: `--enable-recovery` on the MPI launcher's line, which keeps the survivors
  running when a rank dies. commbench's mpirun front adds it too, but the sweep's mpiexec
  is the front only where `commbench setup-mpirun` has run; given, the front keeps it.
  Where --fail has a rank rejoin, `commbench gossip --` around the MPI launcher, which
  starts it again (with `--cluster NAME` on an emulated cluster: on its own machine).
- torchft: `commbench torchft -n N -- RUN FLAGS` in place of the launcher: its replica
  groups are processes of their own, which no launcher's job would keep apart; on an
  emulated cluster, `--cluster NAME` places group g on machine g, so a layout of one
  worker per machine.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Dict, Iterator, List, Optional

from commbench.errors import UsageError
from commbench.faults import fail_schedule
from commbench.faults.recovery import GOSSIP_SUPERVISED, SUPERVISED
from commbench.sweep.run_flags import skip_reason

MPI = ("mpiexec", "mpirun")  # the sweep's MPI launchers: here, and an emulated cluster's
EMULATED = "mpirun"
ONE_PER_MACHINE = ("argument --recovery: torchft places one replica group on each "
                   "emulated machine (commbench torchft --cluster); give a layout of one "
                   "worker per machine, e.g. --emulate 4x1")


def restarts(config, workers: int) -> int:
    """How many times the launcher starts a restarting job again: once per failure of its
    schedule, at least once."""
    return max(1, len(fail_schedule.schedule(config.fail, workers)))


def launcher_options(config, launcher: str, workers: int) -> List[str]:
    """What the job's policy adds to its launcher's own options."""
    if config.recovery == "restart" and launcher == "torchrun":
        return ["--max-restarts", str(restarts(config, workers))]
    if config.recovery == "gossip" and launcher in MPI:
        return ["--enable-recovery"]
    return []


def job_line(command: List[str], config, launcher: str, workers: int,
             job_flags: List[str], cluster: Optional[str] = None) -> List[str]:
    """The job's command: its launcher's line, under `commbench supervise` where an MPI
    job restarts, or torchft's own launcher in its place (on the emulated cluster's
    machines where the job has one)."""
    commbench = [sys.executable, "-m", "commbench"]
    if config.recovery == "restart" and launcher in MPI:
        return [*commbench, "supervise", "--restarts", str(restarts(config, workers)), "--",
                *command]
    if config.recovery == "torchft":
        placed = ["--cluster", cluster] if launcher == EMULATED and cluster else []
        return [*commbench, "torchft", "-n", str(workers), *placed, "--", *job_flags]
    if _rejoins_under_gossip(config, launcher, workers):
        placed = ["--cluster", cluster] if launcher == EMULATED and cluster else []
        return [*commbench, "gossip", *placed, "--", *command]
    return command


def _rejoins_under_gossip(config, launcher: str, workers: int) -> bool:
    """Whether the job is a gossip job under MPI whose --fail has a rank rejoin."""
    return config.recovery == "gossip" and launcher in MPI and any(
        e.rejoin is not None for e in fail_schedule.schedule(config.fail, workers))


def why_not(config, job_flags: List[str], launch, launcher: str) -> Optional[str]:
    """Why the job cannot run under the line job_line gives it, as `commbench run` (or
    `commbench torchft`) would say it; None if it can."""
    if config.recovery == "torchft":
        return _torchft_refusal(job_flags, launch, launcher)
    with _environment(_launcher_environment(config, launcher, launch.world_size)):
        return skip_reason(job_flags, launch)


def _torchft_refusal(job_flags: List[str], launch, launcher: str) -> Optional[str]:
    from commbench.faults.torchft_launch import checked

    if launcher == EMULATED and launch.local_size != 1:
        return ONE_PER_MACHINE
    try:
        checked(job_flags, launch.world_size, on_cluster=launcher == EMULATED)
    except UsageError as e:
        return str(e)
    return None


def _launcher_environment(config, launcher: str, workers: int) -> Dict[str, str]:
    """What the restarting job's launcher tells its ranks: how often it starts them again
    (commbench.faults.recovery.check reads it), or that `commbench gossip` starts a
    rejoining rank again (check_gossip), and that they run on an emulated cluster's
    machines (Cluster.machine_environment: a --fail cut takes their NIC down)."""
    from commbench.cluster.state import as_on_a_machine

    told = as_on_a_machine() if launcher == EMULATED else {}
    if _rejoins_under_gossip(config, launcher, workers):
        return {**told, GOSSIP_SUPERVISED: "1"}
    if config.recovery != "restart":
        return told
    allowed = str(restarts(config, workers))
    return {**told,
            "TORCHELASTIC_MAX_RESTARTS" if launcher == "torchrun" else SUPERVISED: allowed}


@contextlib.contextmanager
def _environment(extra: Dict[str, str]) -> Iterator[None]:
    """os.environ with extra in it for the block, as it was after."""
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
