"""Failures on purpose fired (--fail, commbench.faults.fail_inject): before the step or after
the time an event names, on its rank alone, with a line that says --fail did it; and,
through mpiexec, a killed rank ends the job within seconds and a stopped one at --timeout,
with no result left behind."""

import datetime
import re
import signal

import pytest

from commbench.faults import fail_inject
from commbench.faults.fail_schedule import FailEvent, schedule
from launchers import TINY_RUN, mpiexec, only_result
from test_training_to_accuracy import TINY_TASK


class Fired(Exception):
    """Raised by the stand-in for the signal, so the test process survives the kill."""


def injector(spec, rank, world_size=4, times=None):
    """The rank's injector under a clock that reads `times` in turn, whose signal raises."""
    clock = iter(times or range(1000))

    def die(sig):
        raise Fired(sig)

    return fail_inject.Injector(schedule(spec, world_size), rank, spec, 10.0,
                                clock=lambda: next(clock), die=die)


def steps_until_fired(inject, most=100):
    """How many steps ran before the one the injector fired at, and its signal."""
    ran = []
    stepped = inject.around(lambda: ran.append(1))
    for _ in range(most):
        try:
            stepped()
        except Fired as fired:
            return len(ran), fired.args[0]
    return len(ran), None


def test_a_step_event_fires_as_its_step_begins_on_its_rank_alone():
    assert steps_until_fired(injector("1@step5,2@step3:stop", 1)) == (4, signal.SIGKILL)
    assert steps_until_fired(injector("1@step5,2@step3:stop", 2)) == (2, signal.SIGSTOP)
    assert steps_until_fired(injector("1@step5,2@step3:stop", 0)) == (100, None)


def test_a_timed_event_fires_at_the_first_step_after_its_time_from_the_first_step():
    # the first step at clock 100: 2.5 s into training is the step that begins at 103
    inject = injector("1@2.5s", 1, times=[100, 101, 102, 103, 104])
    assert steps_until_fired(inject, most=5) == (3, signal.SIGKILL)


def test_a_rank_without_events_steps_as_it_was_given():
    step = lambda: None  # noqa: E731
    assert injector("1@step5", 0).around(step) is step


def test_the_line_says_the_failure_was_injected_by_fail_and_when(capsys):
    inject = injector("2@step3:stop", 2)
    assert steps_until_fired(inject) == (2, signal.SIGSTOP)
    line = capsys.readouterr().err
    assert line.count("\n") == 1
    assert line.startswith("commbench: error: rank 2: failure injected by --fail "
                           "(2@step3:stop), not a bug: it stops itself (SIGSTOP) and answers "
                           "no one; the others end the job after --timeout (10 s); at step 3, "
                           "2.00 s into training, ")
    assert re.search(r", \d\d:\d\d:\d\d\.\d{3} UTC$", line.strip())


def test_the_result_records_the_expanded_schedule():
    assert fail_inject.facts("none", 4) is None
    recorded = fail_inject.facts("mtbf=60s,seed=1", 4)
    assert recorded["spec"] == "mtbf=60s,seed=1"
    assert recorded["events"] == [e.to_dict() for e in schedule("mtbf=60s,seed=1", 4)]
    assert FailEvent(1, step=4).to_dict() == {"rank": 1, "step": 4, "seconds": None,
                                              "kind": "kill", "rejoin_seconds": None}
    assert fail_inject.describe("1@step4,2@45s:stop", 4) == \
        "rank 1 killed at step 4, rank 2 stopped after 45 s"


def failed_job(tmp_path, n, args, timeout=120):
    """The job, the injected rank's line, and the seconds from that line's time to the
    launcher's exit: how long the failure took to end the job."""
    done = mpiexec(n, ["-m", "commbench", *args, "--results-dir", str(tmp_path)],
                   timeout=timeout)
    ended = datetime.datetime.now(datetime.timezone.utc)
    lines = [line for line in done.stderr.splitlines() if "failure injected by --fail" in line]
    assert len(lines) == 1, done.stderr[-3000:]
    at = datetime.datetime.strptime(lines[0].rsplit(", ", 1)[1], "%H:%M:%S.%f UTC")
    fired = ended.replace(hour=at.hour, minute=at.minute, second=at.second,
                          microsecond=at.microsecond)
    seconds = (ended - fired).total_seconds() % 86400  # across midnight too
    print(f"detected after {seconds:.1f} s: the injected failure to the job's end")
    assert not list(tmp_path.glob("*.json"))  # a failed run claims nothing
    return done, lines[0], seconds


@pytest.mark.mpi
@pytest.mark.parametrize("kind, args, fail", [
    ("speed", TINY_RUN, "1@step4"),
    ("accuracy", [*TINY_TASK, "--max-epochs", "10"], "1@0.5s"),
])
def test_a_killed_rank_ends_the_job_within_seconds_with_its_line(tmp_path, kind, args, fail):
    done, line, seconds = failed_job(tmp_path, 2, [*args, "--fail", fail])
    # The launcher's status is the killed rank's, or, on a loaded box where the survivor
    # saw its connection close before the launcher saw the death, the survivor's 1.
    assert done.returncode in (128 + signal.SIGKILL, 1), (done.returncode,
                                                          done.stderr[-3000:])
    assert line.startswith(f"commbench: error: rank 1: failure injected by --fail ({fail}"), line
    assert "it kills itself (SIGKILL); the job ends now" in line
    assert seconds < 20, f"detected after {seconds:.1f} s"


@pytest.mark.mpi
def test_a_stopped_rank_ends_the_job_at_the_timeout(tmp_path):
    done, line, seconds = failed_job(tmp_path, 2, [*TINY_RUN, "--fail", "1@step4:stop",
                                                   "--timeout", "10"])
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    assert line.startswith("commbench: error: rank 1: failure injected by --fail "
                           "(1@step4:stop), not a bug: it stops itself (SIGSTOP)"), line
    # rank 0's own line, from the wait that outlasted --timeout (gloo's or commbench's)
    assert "commbench: error: rank 0:" in done.stderr, done.stderr[-3000:]
    assert 10 <= seconds < 10 + 30, f"detected after {seconds:.1f} s"


@pytest.mark.mpi
def test_a_failure_that_is_never_due_is_recorded_and_said(tmp_path):
    done = mpiexec(2, ["-m", "commbench", *TINY_RUN, "--fail", "1@1h",
                       "--results-dir", str(tmp_path)], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Failures on purpose (--fail): rank 1 killed after 3600 s; with no recovery " \
        "policy the first one ends the job" in done.stdout
    assert "Warning: --fail 1@3600s:kill: the run ended before any of its failures was due; " \
        "nothing failed" in done.stdout
    doc = only_result(tmp_path)
    assert doc["config"]["fail"] == "1@3600s:kill"
    assert doc["failures"] == {"spec": "1@3600s:kill", "events": [
        {"rank": 1, "step": None, "seconds": 3600.0, "kind": "kill", "rejoin_seconds": None}]}
