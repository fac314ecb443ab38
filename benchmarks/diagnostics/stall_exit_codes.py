"""Does the way commbench ends a stalled job make Open MPI's launcher crash? 2-rank
jobs under mpiexec whose rank 1 stops (SIGSTOP: alive but silent), so that commbench's
stall handling ends the job, --tries times per case; the table counts how each ended.

    python benchmarks/diagnostics/stall_exit_codes.py [--tries 10]
        [--cases bare,gloo-wait,mpi-wait,mpi-init] [--timeout 3]

The cases, one per way commbench ends a job after a stall:
- bare: no commbench, the reference: rank 0 calls MPI_Abort (mpi4py) while rank 1 is
  stopped, as every commbench case below ends;
- gloo-wait: torch's gloo times out in the step; rank 0's main thread calls MPI_Abort;
- mpi-wait: an MPI wait of neighbor_allreduce outlasts --timeout; the deadline thread
  calls MPI_Abort while the main thread is still inside MPI;
- mpi-init: rank 1 stops before MPI's initialisation; rank 0, still inside it, asks the
  launcher to end the job through PMIx_Abort and exits with os._exit.

How a job ended, told apart by its exit status: 1 is commbench's (or the bare
program's); 128+N is mpiexec reporting that a rank died of signal N (PRRTE exits so,
with its "exited on signal" message: a rank crashed, not mpiexec); a negative status is
mpiexec itself killed by signal -N (the front of `commbench setup-mpirun` dies of the
signal its mpirun died of); 124, no end within --timeout + 90 s.
"""

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TESTS = ROOT / "tests"  # the fault plugins and stop_rank.py of the failure tests
TINY_RUN = ["--model", "resnet18", "--image-size", "32", "--batch-size", "8",
            "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "3",
            "--reference-iters", "1", "--reference-seconds", "0"]
BARE = """import os, signal, sys, time
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
if MPI.COMM_WORLD.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(%s)
print("bare: error: rank 0: stalled peer", file=sys.stderr, flush=True)
MPI.COMM_WORLD.Abort(1)
"""


def programs(timeout: float):
    """case -> the program and arguments mpiexec starts."""
    run = [*TINY_RUN, "--timeout", f"{timeout:g}"]
    return {
        "bare": ["-c", BARE % timeout],
        "gloo-wait": ["-m", "commbench", "--dist-optimizer=fault_plugins:Stopped", *run],
        "mpi-wait": ["-m", "commbench", "--dist-optimizer=fault_plugins:StoppedNeighbor",
                     *run],
        "mpi-init": [str(TESTS / "programs" / "stop_rank.py"), "1", "mpi-init", *run],
    }


def ending(status: int) -> str:
    """What an exit status of mpiexec says about how the job ended."""
    if status == 1:
        return "exit 1"
    if status == 124:
        return "no end"
    if status < 0:
        return f"mpiexec killed by signal {-status}"
    if status > 128:
        return f"a rank died of signal {status - 128}"
    return f"exit {status}"


def one_try(mpiexec: str, program, timeout: float, results: str):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    cmd = [mpiexec, "-n", "2", "--oversubscribe", "--bind-to", "none", sys.executable,
           *program, *(["--results-dir", results] if program[0] != "-c" else [])]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout + 90)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        _, err = proc.communicate()
        status = 124
    return status, time.monotonic() - start, err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--cases", default="bare,gloo-wait,mpi-wait,mpi-init")
    parser.add_argument("--timeout", type=float, default=3.0, help="the jobs' --timeout")
    args = parser.parse_args()
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True)
    print(f"{mpiexec}: {version.stdout.splitlines()[0] if version.stdout else '?'}")
    print(f"{'case':<10} {'tries':>5}  {'median s':>8}  endings")
    unexpected = []
    for case in args.cases.split(","):
        program, counts, seconds = programs(args.timeout)[case], collections.Counter(), []
        for n in range(args.tries):
            with tempfile.TemporaryDirectory() as results:
                status, took, err = one_try(mpiexec, program, args.timeout, results)
            counts[ending(status)] += 1
            seconds.append(took)
            if status != 1:
                unexpected.append(f"{case} try {n + 1}: status {status}\n{err[-1500:]}")
        told = ", ".join(f"{what}: {k}" for what, k in counts.most_common())
        print(f"{case:<10} {args.tries:>5}  {statistics.median(seconds):>8.1f}  {told}",
              flush=True)
    for text in unexpected:  # the launcher's own words, for every ending other than 1
        print(f"\n--- {text}")


if __name__ == "__main__":
    main()
