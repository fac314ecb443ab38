"""Start-up is under --timeout too: a rank that stops before the process group exists,
or before its first exchange, ends the job after --timeout with one line, naming the
ranks that did not arrive where the waiting rank can know them, and nothing is written
(commbench.job.failure's start-up line, the roll calls of commbench.launch.rendezvous and
commbench.launch.distributed, and commbench.launch.late_ranks after them)."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commbench.job import failure
from commbench.launch.rendezvous import poll_until
from launchers import TINY_RUN, launcher_env, mpiexec, torchrun

PROGRAM = str(Path(__file__).resolve().parent / "programs" / "stop_rank.py")
STOP_MARK = "COMMBENCH_TEST_STOP_MARK"  # as in programs/stop_rank.py
TIMEOUT = 20  # the jobs' --timeout
# torchrun gives a worker 30 s to end after SIGTERM, which a stopped worker cannot
# act on, before it sends SIGKILL; mpirun sends SIGCONT first.
LAUNCHER_GRACE = {"mpiexec": 0, "torchrun": 30}
LAUNCHERS = {"mpiexec": mpiexec, "torchrun": torchrun}
STARTUP_LINE = re.compile(r"^commbench: error: rank 0 \([^)]+\): start-up: .*$", re.MULTILINE)


def stalled_job(launcher, when, tmp_path):
    """A tiny 2-rank run whose rank 1 stops at `when` (programs/stop_rank.py); the job,
    and the seconds from the stop to the launcher's exit."""
    mark = tmp_path / "stopped"
    done = LAUNCHERS[launcher](2, [PROGRAM, "1", when, *TINY_RUN, "--timeout", str(TIMEOUT),
                                   "--results-dir", str(tmp_path / "results")],
                               timeout=TIMEOUT + 150, env={STOP_MARK: str(mark)})
    ended = time.monotonic()
    assert mark.exists(), done.stderr[-3000:]
    return done, ended - float(mark.read_text())


def only_startup_line(done) -> str:
    """Rank 0's start-up line, the job's first; after it only the stopped rank may speak,
    of the connection rank 0 closed: mpirun wakes it (SIGCONT) before it ends it, and on
    a loaded box it can say so first. A line may follow the blank end of the launcher's
    own banner on the same line: both write to one stderr."""
    lines = [line.lstrip() for line in done.stderr.splitlines()
             if line.lstrip().startswith("commbench:")]
    assert lines and all(line.startswith("commbench: error: rank 1") for line in lines[1:]), \
        done.stderr[-3000:]
    assert STARTUP_LINE.match(lines[0]), lines
    # (after it, torchrun's own traceback of the failed worker)
    assert "Traceback" not in done.stderr.split(lines[0])[0], done.stderr[-3000:]
    return lines[0]


@pytest.mark.mpi
@pytest.mark.timeout(TIMEOUT + 200)
@pytest.mark.parametrize("launcher, when, named", [
    # Stopped at a named point, not after a time: how far a rank gets in 5 s depends
    # on the machine's load and the torch version. Before MPI_Init the others wait in
    # it, where MPI cannot say who is missing; under torchrun rank 0 waits at the store.
    ("mpiexec", "mpi-init", "MPI cannot say which rank is missing"),
    ("torchrun", "store-roll-call", "rank 1 of 2 did not arrive at torch.distributed's "
                                    "rendezvous"),
    ("mpiexec", "mpi-roll-call", "rank 1 of 2 did not arrive at the rendezvous over MPI"),
    ("mpiexec", "store-roll-call", "rank 1 (%s) of 2 did not arrive at torch.distributed"),
    # After the roll call: named as the roll call names, not by gloo's time-out.
    ("torchrun", "process-group", "rank 1 of 2 did not reach torch.distributed's process "
                                  "group within 20 s"),
    ("mpiexec", "first-collective", "rank 1 (%s) of 2 did not reach the first exchange"),
])
def test_a_rank_stopped_in_start_up_ends_the_job_within_the_timeout(launcher, when, named,
                                                                    tmp_path):
    done, seconds = stalled_job(launcher, when, tmp_path)
    assert done.returncode != 0
    assert seconds < TIMEOUT + 30 + LAUNCHER_GRACE[launcher], done.stderr[-3000:]
    line = only_startup_line(done)
    assert (named % os.uname().nodename if "%s" in named else named) in line, line
    assert not list((tmp_path / "results").glob("*.json"))


@pytest.mark.mpi
@pytest.mark.timeout(TIMEOUT + 200)
def test_a_rank_stopped_5_s_after_launch_ends_the_job_within_the_timeout(tmp_path):
    """The issue's case, wherever in start-up the rank happens to be then."""
    done, seconds = stalled_job("mpiexec", "5", tmp_path)
    assert done.returncode != 0
    assert seconds < TIMEOUT + 30, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("commbench:")]
    assert lines and all(line.startswith("commbench: error: rank ") for line in lines), \
        done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "results").glob("*.json"))


@pytest.mark.job
def test_a_start_up_wait_past_its_deadline_ends_the_process_with_one_line():
    code = ("import time\n"
            "from commbench.job.failure import startup_wait\n"
            "with startup_wait(0.5, 'rank 3 did not arrive'):\n"
            "    time.sleep(60)\n")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=launcher_env())
    assert time.monotonic() - began < 30
    assert done.returncode == 1
    assert done.stderr == (f"commbench: error: rank 0 ({os.uname().nodename}): start-up: "
                           "rank 3 did not arrive\n")


def test_a_start_up_wait_that_ends_in_time_ends_nothing(monkeypatch):
    ended = []
    monkeypatch.setattr(failure, "startup_failed", lambda *a, **kw: ended.append(a))
    with failure.startup_wait(0.2, "late"):
        pass
    time.sleep(0.4)
    assert ended == []
    with failure.startup_wait(0.1, "late"):
        # past the deadline, as long as a loaded machine takes to wake the timer's thread
        assert poll_until(time.monotonic() + 30, lambda: ended)
    assert ended == [("late", True)]


def test_ranks_are_named_with_their_machines_where_known():
    assert failure.name_ranks([1]) == "rank 1"
    assert failure.name_ranks([3, 1], ["a", "b", None, "d"]) == "ranks 1 (b), 3 (d)"
    assert failure.name_ranks(range(1, 100), most=2) == "ranks 1, 2, ... (99 in all)"


def test_a_rank_waits_for_rank_0_longer_than_rank_0_waits_for_anyone():
    assert failure.patience_for_rank_0(20) >= 20 + failure.ROLL_CALL_GRACE


def test_polling_stops_at_the_deadline_and_not_before_success():
    assert poll_until(time.monotonic() + 5, lambda: True)
    began = time.monotonic()
    assert not poll_until(began + 0.2, lambda: False)
    assert 0.2 <= time.monotonic() - began < 2


def test_a_failed_start_up_step_names_the_ranks_that_never_entered_it(monkeypatch):
    import torch.distributed as dist

    from commbench.launch import late_ranks

    said = []
    monkeypatch.setattr(late_ranks, "startup_failed", said.append)
    store = dist.HashStore()
    for rank in (1, 3):
        store.add(f"commbench/entered/the step/{rank}", 1)
    late = late_ranks.LateRanks(store, 0, 4, 20, ("a", "b", "c", "d"))
    with pytest.raises(RuntimeError, match="gloo's time-out"):
        with late.step("the step"):
            raise RuntimeError("gloo's time-out")
    assert said == ["rank 2 (c) of 4 did not reach the step within 20 s (--timeout)"]
    store.add("commbench/entered/the step/2", 1)  # every rank came: the error is not theirs
    with pytest.raises(RuntimeError, match="something else"):
        with late.step("the step"):
            raise RuntimeError("something else")
    assert len(said) == 1
