"""Running a sweep's jobs one after another, each in its own process group with a
timeout: progress and an estimate of the time left, each job's headline or the last
lines of its output, and the result file it reports back.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

from commbench.result.store import RECEIPT
from commbench.sweep.plan import Job, shell_line

TAIL_LINES = 15
GRACE_SECONDS = 5  # for a stopped job's launcher to end its ranks itself


def job_environment(quick: bool = False) -> Dict[str, str]:
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


def run_jobs(jobs: List[Job], timeout: float, env: Dict[str, str],
             before_each: Callable[[], None] = lambda: None) -> None:
    runnable = [j for j in jobs if not j.skip_reason]  # the rest are listed by the sweep
    start = time.monotonic()
    for index, job in enumerate(runnable, 1):
        before_each()
        again = f" (repeat {job.repeat})" if job.repeat > 1 else ""
        print(f"[{index}/{len(runnable)}] {job.strategy} on {job.workers} worker(s){again}: "
              f"{shell_line(job.command)}", flush=True)
        output = run_one(job, timeout, env)
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


def run_one(job: Job, timeout: float, env: Dict[str, str]) -> str:
    with tempfile.TemporaryDirectory(prefix="commbench-sweep-") as scratch:
        receipt = Path(scratch) / "result"
        begin = time.monotonic()
        proc = subprocess.Popen(job.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**env, RECEIPT: str(receipt)},
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end_job(proc)
            output, _ = proc.communicate()
            output += f"\n(ended by the sweep after its {timeout:.0f} s timeout)"
        except BaseException:  # Ctrl-C, SIGTERM: the job, in a session of its own, goes too
            _end_job(proc)
            raise
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
    """A job's total throughput (img/sec, tokens/sec) and in-job efficiency, read from its
    result file; for a run trained to accuracy, its time to the target or its best
    accuracy."""
    from commbench.result.metrics import rate_name, trust_flags
    from commbench.result.store import read_result
    from commbench.job.console import percent, total_line, trained_line

    doc = read_result(path)
    summary = doc["summary"]
    if doc.get("kind") == "accuracy":
        return trained_line(summary) + recovered(doc.get("recovery"), rate_name(summary))
    kind = "GPU" if (doc.get("environment") or {}).get("device") == "cuda" else "worker"
    line = total_line(summary, kind)
    if "efficiency_in_job" in summary:
        line += (", in-job efficiency "
                 f"{percent(summary['efficiency_in_job'], summary.get('efficiency_in_job_ci95'))}")
    flags = trust_flags(summary)
    line += f" [NOT TO BE TRUSTED: {', '.join(flags)}]" if flags else ""
    diverged = summary.get("diverged")
    return line + (f" [diverged at step {diverged['step']}]" if diverged else "")


def recovered(facts, rate: str) -> str:
    """What a job's recovery policy (--recovery) made of its failures, after its headline:
    a job that recovered ended well, and this says at what cost, its goodput in `rate`
    (img/sec, tokens/sec); the report has each failure's."""
    if not facts:
        return ""
    failures = len(facts.get("costs") or ())
    return (f"; --recovery {facts['policy']}, {failures} failure{'' if failures == 1 else 's'}"
            f": goodput {facts['goodput']:.1f} {rate} of wall time")


def _end_job(proc: subprocess.Popen) -> None:
    """SIGTERM to the job's launcher, which ends its ranks (mpirun, torchrun), then
    SIGKILL to whatever is left in the job's session: launchers put each rank in a
    process group of its own, where a signal to the launcher's group does not reach."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=GRACE_SECONDS)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in [proc.pid, *_in_session(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _in_session(sid: int) -> List[int]:
    """The processes of session `sid` (Linux's /proc; none found elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if os.getsid(int(entry.name)) == sid:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _remaining(jobs: List[Job], done: int, elapsed: float) -> float:
    """Estimate from the worker-seconds so far: bigger jobs take longer."""
    spent = sum(j.workers for j in jobs[:done])
    return elapsed / spent * sum(j.workers for j in jobs[done:]) if spent else 0.0


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"
