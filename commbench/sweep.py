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
from typing import Dict, List, Optional

from commbench.config import RunConfig
from commbench.errors import UsageError
from commbench.flags import add_flags, flag_fields, positive_float, positive_int, positive_ints
from commbench.results import RECEIPT

# A few minutes for 1,2,4 workers x 3 strategies on 2 cores, and long enough that two
# sweeps agree on every total and ranking (benchmarks/quick_sweep_stability.py).
QUICK = ["--model", "squeezenet1_1", "--image-size", "32", "--batch-size", "16",
         "--num-warmup-batches", "20", "--num-batches-per-iter", "5", "--num-iters", "10",
         "--reference-iters", "4"]
TAIL_LINES = 15


@dataclass
class Job:
    workers: int
    strategy: str
    command: List[str]
    skip_reason: Optional[str] = None
    repeat: int = 1  # which of the configuration's --repeat runs
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
    parser.add_argument("--dry-run", action="store_true",
                        help="print the launcher commands, run nothing")
    parser.epilog = "Any other `commbench run` flag is passed to every job."


# Flags this parser does not know are `commbench run` flags, for every job.
PASSES_RUN_FLAGS = True


def main(args) -> int:
    flags = (QUICK if args.quick else []) + args.run_flags
    strategies = [s for s in args.dist_optimizer.split(",") if s]
    jobs = plan(args.np, strategies, flags, args.launcher, args.results_dir, args.repeat)
    if args.dry_run:
        for job in jobs:
            print(f"# skipped: {job.strategy} on {job.workers}: {job.skip_reason}"
                  if job.skip_reason else shell_line(job.command)
                  + (f"  # repeat {job.repeat}/{args.repeat}" if args.repeat > 1 else ""))
        return 0
    Path(args.results_dir).mkdir(parents=True, exist_ok=True)
    run_jobs(jobs, args.job_timeout, _job_environment(args.quick))
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
    from commbench.cli import build_parser
    from commbench.config import config_from_args
    from commbench.launch.detect import LaunchInfo
    from commbench.run import validate

    jobs = []
    for strategy, workers in itertools.product(strategies, counts):
        job_flags = [f"--dist-optimizer={strategy}", *flags, "--results-dir", results_dir]
        # The run parser rejects a bad flag here, once, instead of in every job.
        config = config_from_args(build_parser().parse_args(["run", *job_flags]))
        job = Job(workers, strategy, launch_command(launcher, workers, job_flags))
        try:
            validate(config, LaunchInfo(launcher, 0, workers, 0, workers, 0))
        except UsageError as e:
            job.skip_reason = str(e)
        jobs.append(job)
    return [dataclasses.replace(j, repeat=r + 1) for r in range(repeat) for j in jobs
            if r == 0 or not j.skip_reason]


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
