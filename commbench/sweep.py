"""`commbench sweep`: a scaling study on this machine in one command.

Every combination of worker count and strategy runs as its own job through a real
launcher (the `mpiexec` that the `mpi` extra installs, or `torchrun`), each with a
timeout; then the report and the charts of exactly the runs it made.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from commbench.config import RunConfig
from commbench.errors import UsageError
from commbench.flags import (accepting, add_flags, flag_fields, positive_float, positive_int,
                             positive_ints)
from commbench.results import RECEIPT

# A few minutes for 1,2,4 workers x 3 strategies on 2 cores, each job measured long
# enough that its own interval is narrow; whether two sweeps then agree is up to how
# steady the machine is (benchmarks/machine_drift.py, quick_sweep_stability.py).
QUICK = ["--model", "squeezenet1_1", "--image-size", "32", "--batch-size", "16",
         "--num-warmup-batches", "20", "--num-batches-per-iter", "5", "--num-iters", "60",
         "--reference-iters", "4", "--reference-seconds", "3"]
TAIL_LINES = 15


@dataclass
class Job:
    workers: int
    strategy: str
    command: List[str]
    skip_reason: Optional[str] = None
    repeat: int = 1  # which of the configuration's --repeat runs
    link: Optional[str] = None  # the emulated cluster's link rate it runs on (--emulate)
    ok: bool = False
    seconds: float = 0.0
    result: Optional[Path] = None
    headline: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--np", default=[1, 2, 4], type=positive_ints, metavar="N,N,...",
                        help="worker counts to run (default: 1,2,4)")
    parser.add_argument("--dist-optimizer", default="allreduce", metavar="NAME,...",
                        help="strategies to run, comma-separated (default: allreduce)")
    parser.add_argument("--launcher", choices=("mpiexec", "torchrun"), default="mpiexec",
                        help="how each job is started (default: mpiexec)")
    parser.add_argument("--quick", action="store_true",
                        help="a small model and images, one thread per worker: "
                        + " ".join(QUICK))
    parser.add_argument("--job-timeout", type=positive_float, default=900, metavar="SECONDS",
                        help="end a job that runs longer than this (default: 900)")
    add_flags(parser, flag_fields(RunConfig, ["results_dir"]))
    parser.add_argument("--plots-dir", default="charts", metavar="DIR",
                        help="where the charts go (default: charts)")
    parser.add_argument("--repeat", type=positive_int, default=1, metavar="K",
                        help="run every configuration K times, round-robin (default: 1)")
    parser.add_argument("--emulate", type=layouts, metavar="MxS,...",
                        help="run on an emulated cluster instead (needs root; see `commbench "
                             "cluster`): each layout M machines x S ranks per machine, e.g. "
                             "1x1,2x2,4x1; takes the place of --np")
    parser.add_argument("--link", type=link_rates, default=["1gbit"], metavar="RATE,...",
                        help="with --emulate: each machine's link rate, one cluster per rate "
                             "(default: 1gbit)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the launcher commands, run nothing")
    parser.epilog = "Any other `commbench run` flag is passed to every job."


# Flags this parser does not know are `commbench run` flags, for every job.
PASSES_RUN_FLAGS = True


@accepting("layouts MxS (machines x ranks per machine), comma-separated, e.g. 2x2,4x1")
def layouts(text: str) -> List[Tuple[int, int]]:
    found = [tuple(int(n) for n in part.lower().split("x")) for part in text.split(",")]
    if not found or any(len(f) != 2 or min(f) < 1 for f in found):
        raise ValueError
    return list(dict.fromkeys(found))


@accepting("link rates as tc spells them, comma-separated, e.g. 1gbit,200mbit")
def link_rates(text: str) -> List[str]:
    from commbench.cluster.network import RATE

    found = [r.strip() for r in text.split(",") if r.strip()]
    if not found or not all(RATE.match(r) for r in found):
        raise ValueError
    return list(dict.fromkeys(found))


def main(args) -> int:
    flags = (QUICK if args.quick else []) + args.run_flags
    strategies = [s for s in args.dist_optimizer.split(",") if s]
    cluster = f"s{os.getpid() % 10**6}"  # this sweep's own: two sweeps never share one
    if args.emulate:
        jobs = plan_emulated(args.emulate, args.link, cluster, strategies, flags,
                             args.results_dir, args.repeat)
    else:
        jobs = plan(args.np, strategies, flags, args.launcher, args.results_dir, args.repeat)
    if args.dry_run:
        for link in dict.fromkeys(j.link for j in jobs):
            if link:
                machines, slots = _cluster_shape(args.emulate)
                print(f"# commbench cluster up --name {cluster} --machines {machines} "
                      f"--slots {slots} --link {link}")
            for job in (j for j in jobs if j.link == link):
                print(f"# skipped: {job.strategy} on {job.workers}: {job.skip_reason}"
                      if job.skip_reason else shell_line(job.command)
                      + (f"  # repeat {job.repeat}/{args.repeat}" if args.repeat > 1 else ""))
            if link:
                print(f"# commbench cluster down --name {cluster}")
        return 0
    Path(args.results_dir).mkdir(parents=True, exist_ok=True)
    env = _job_environment(args.quick)
    if args.emulate:
        run_emulated(jobs, args.job_timeout, env, cluster, _cluster_shape(args.emulate))
    else:
        run_jobs(jobs, args.job_timeout, env)
    made = [str(j.result) for j in jobs if j.result]
    if made:
        _commbench("report", *made)
        _commbench("plot", *made, "-o", args.plots_dir)
    failed = [j for j in jobs if not j.ok and not j.skip_reason]
    if failed:
        print(f"{len(failed)} job(s) failed: " + ", ".join(
            f"{j.strategy} on {j.workers}" for j in failed), flush=True)
    return 1 if failed or not made else 0


def plan(counts: List[int], strategies: List[str], flags: List[str], launcher: str,
         results_dir: str, repeat: int = 1) -> List[Job]:
    """One job per (strategy, worker count), `repeat` times round-robin (every
    configuration once, then again: drift of the machine spreads over all of them);
    impossible ones carry a skip reason, once."""
    from commbench.launch.detect import LaunchInfo

    jobs = []
    for strategy, workers in itertools.product(strategies, counts):
        job_flags = _job_flags(strategy, flags, results_dir)
        jobs.append(Job(workers, strategy, launch_command(launcher, workers, job_flags),
                        _skip_reason(job_flags, LaunchInfo(launcher, 0, workers, 0, workers, 0))))
    return _repeated(jobs, repeat)


def _job_flags(strategy: str, flags: List[str], results_dir: str) -> List[str]:
    return [f"--dist-optimizer={strategy}", *flags, "--results-dir", results_dir]


def _skip_reason(job_flags: List[str], launch) -> Optional[str]:
    """Why the job cannot run, as `commbench run` would say it; None if it can.
    The run parser rejects a bad flag here, once, instead of in every job."""
    from commbench.cli import build_parser
    from commbench.config import config_from_args
    from commbench.run import validate

    try:
        validate(config_from_args(build_parser().parse_args(["run", *job_flags])), launch)
    except UsageError as e:
        return str(e)
    return None


def _repeated(jobs: List[Job], repeat: int) -> List[Job]:
    return [dataclasses.replace(j, repeat=r + 1) for r in range(repeat) for j in jobs
            if r == 0 or not j.skip_reason]


def plan_emulated(shapes: List[Tuple[int, int]], links: List[str], cluster: str,
                  strategies: List[str], flags: List[str], results_dir: str,
                  repeat: int = 1) -> List[Job]:
    """plan() on an emulated cluster: per link rate, one job per (strategy, layout),
    each through mpirun on the layout's machines. Not bound to cores: every emulated
    machine would bind its ranks to the same host cores."""
    from commbench.cluster.network import Cluster
    from commbench.launch.detect import LaunchInfo

    on = Cluster(cluster, *_cluster_shape(shapes), "", "")
    jobs = []
    for link, strategy, (m, s) in itertools.product(links, strategies, shapes):
        job_flags = _job_flags(strategy, flags, results_dir)
        hosts = ",".join(f"{on.machine(i)}:{s}" for i in range(m))
        command = [_tool("mpirun"), "-H", hosts, "-np", str(m * s), "--bind-to", "none",
                   sys.executable, "-m", "commbench", *job_flags]
        reason = _skip_reason(job_flags, LaunchInfo("openmpi", 0, m * s, 0, s, 0))
        jobs.append(Job(m * s, strategy, command, reason, link=link))
    return _repeated(jobs, repeat)


def _cluster_shape(shapes: List[Tuple[int, int]]) -> Tuple[int, int]:
    return max(m for m, _ in shapes), max(s for _, s in shapes)


def run_emulated(jobs: List[Job], timeout: float, env: Dict[str, str], name: str,
                 shape: Tuple[int, int]) -> None:
    """run_jobs on one emulated cluster per link rate, each removed at the end: on
    success, failure, Ctrl-C or SIGTERM (after a SIGKILL: `commbench cluster down
    --name NAME`)."""
    import signal

    from commbench.cluster import network

    network.check_privileges()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for link in dict.fromkeys(j.link for j in jobs):
        print(f"Emulated cluster {name}: {shape[0]} machines x {shape[1]} slots at {link} "
              f"(if this sweep is killed: commbench cluster down --name {name})", flush=True)
        try:
            cluster = network.up(name, shape[0], shape[1], link)
            run_jobs([j for j in jobs if j.link == link], timeout,
                     {**env, "PATH": f"{cluster.bin}{os.pathsep}{env.get('PATH', '')}"})
        finally:
            network.down(name)


def launch_command(launcher: str, workers: int, run_flags: List[str]) -> List[str]:
    python = sys.executable
    if launcher == "torchrun":
        return [_tool("torchrun"), "--standalone", "--nproc-per-node", str(workers),
                "-m", "commbench", *run_flags]
    mpiexec = [_tool("mpiexec"), "-n", str(workers)]
    if workers > (os.cpu_count() or 1):
        mpiexec.append("--oversubscribe")  # Open MPI refuses more ranks than cores
    return mpiexec + [python, "-m", "commbench", *run_flags]


def _tool(name: str) -> str:
    """The launcher installed beside this Python (the mpi extra's), else PATH's."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def shell_line(command: List[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)


def _job_environment(quick: bool = False) -> Dict[str, str]:
    env = dict(os.environ)
    if quick:
        # A worker is one core: a small model runs slower on two threads than on one,
        # which would make the 1-worker baseline, and so every E(N), misleading.
        env.setdefault("OMP_NUM_THREADS", "1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Open MPI refuses to start as root unless told twice; a sweep on a
        # container or CI box is usually root.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def run_jobs(jobs: List[Job], timeout: float, env: Dict[str, str]) -> None:
    runnable = [j for j in jobs if not j.skip_reason]
    for job in jobs:
        if job.skip_reason:
            print(f"skip {job.strategy} on {job.workers} worker(s): {job.skip_reason}",
                  flush=True)
    start = time.monotonic()
    for index, job in enumerate(runnable, 1):
        again = f" (repeat {job.repeat})" if job.repeat > 1 else ""
        print(f"[{index}/{len(runnable)}] {job.strategy} on {job.workers} worker(s){again}: "
              f"{shell_line(job.command)}", flush=True)
        output = _run_one(job, timeout, env)
        if job.ok:
            print(f"    done in {job.seconds:.1f} s: {job.headline}\n    result: {job.result}",
                  flush=True)
        else:
            print(f"    FAILED after {job.seconds:.1f} s; last lines of its output:", flush=True)
            for line in output.splitlines()[-TAIL_LINES:]:
                print(f"    | {line}", flush=True)
        print(f"    elapsed {_clock(time.monotonic() - start)}, "
              f"about {_clock(_remaining(runnable, index, time.monotonic() - start))} left",
              flush=True)


def _run_one(job: Job, timeout: float, env: Dict[str, str]) -> str:
    with tempfile.TemporaryDirectory(prefix="commbench-sweep-") as scratch:
        receipt = Path(scratch) / "result"
        begin = time.monotonic()
        proc = subprocess.Popen(job.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**env, RECEIPT: str(receipt)},
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            output, _ = proc.communicate()
            output += f"\n(ended by the sweep after its {timeout:.0f} s timeout)"
        job.seconds = time.monotonic() - begin
        if proc.returncode == 0:
            try:
                job.result = Path(receipt.read_text())
                job.headline = headline(job.result)
                job.ok = True
            except (OSError, ValueError) as e:
                output += f"\n(the job ended well but left no usable result: {e})"
    return output


def headline(path: Path) -> str:
    """A job's total img/sec and in-job efficiency, read from its result file."""
    from commbench.metrics import trust_flags
    from commbench.results import read_result
    from commbench.run import percent, total_line

    doc = read_result(path)
    summary = doc["summary"]
    kind = "GPU" if (doc.get("environment") or {}).get("device") == "cuda" else "worker"
    line = total_line(summary, kind)
    if "efficiency_in_job" in summary:
        line += (", in-job efficiency "
                 f"{percent(summary['efficiency_in_job'], summary.get('efficiency_in_job_ci95'))}")
    flags = trust_flags(summary)
    return line + (f" [NOT TO BE TRUSTED: {', '.join(flags)}]" if flags else "")


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _remaining(jobs: List[Job], done: int, elapsed: float) -> float:
    """Estimate from the worker-seconds so far: bigger jobs take longer."""
    spent = sum(j.workers for j in jobs[:done])
    return elapsed / spent * sum(j.workers for j in jobs[done:]) if spent else 0.0


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _commbench(*args: str) -> None:
    print(f"$ commbench {args[0]} ...", flush=True)
    subprocess.run([sys.executable, "-m", "commbench", *args], check=False)
