"""Failures on purpose (--fail, commbench.faults.fail_schedule): the SPEC read and written
back, the seeded random schedule expanded the same way for every strategy, and bad
schedules refused in one line."""

import pytest

from cli_helpers import commbench
from commbench.errors import UsageError
from commbench.faults import fail_schedule
from commbench.faults.fail_schedule import FailEvent, RandomSchedule
from launchers import TINY_RUN


@pytest.mark.parametrize("text, parsed, written", [
    ("none", None, "none"),
    ("1@step200", (FailEvent(1, step=200),), "1@step200:kill"),
    ("2@45s:stop", (FailEvent(2, seconds=45.0, kind="stop"),), "2@45s:stop"),
    ("1@step200:kill+10s", (FailEvent(1, step=200, rejoin=10.0),), "1@step200:kill+10s"),
    (" 3@1.5m, 0@500ms:stop ", (FailEvent(3, seconds=90.0),
                                FailEvent(0, seconds=0.5, kind="stop")),
     "3@90s:kill,0@0.5s:stop"),
    ("mtbf=60s,seed=1", RandomSchedule(60.0, 1), "mtbf=60s,seed=1"),
    ("seed=7,kind=stop,mtbf=2m", RandomSchedule(120.0, 7, "stop"), "mtbf=120s,seed=7,kind=stop"),
    ("mtbf=60s,seed=1,rejoin=10s", RandomSchedule(60.0, 1, rejoin=10.0),
     "mtbf=60s,seed=1,rejoin=10s"),
])
def test_the_flag_reads_events_and_random_schedules(text, parsed, written):
    assert fail_schedule.parse(text) == parsed
    assert fail_schedule.spec(text) == written
    assert fail_schedule.parse(written) == parsed  # recorded the one way it reads back


@pytest.mark.parametrize("value", ["", "1", "1@", "@step3", "1@step0", "1@step", "1@45",
                                   "1@45x", "1@0s", "-1@step3", "1@step3:hang", "1@step3+",
                                   "1@step3+10", "1@step3,", "mtbf=60s", "seed=1",
                                   "mtbf=0s,seed=1", "mtbf=60s,seed=x", "mtbf=60s,seed=1,kind=melt",
                                   "mtbf=60s,seed=1,rate=2",
                                   "mtbf=60s,seed=1,rejoin=0s", "mtbf=60s,seed=1,rejoin=x"])
def test_bad_specs_are_refused_in_one_line(value):
    done = commbench("run", f"--fail={value}")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "argument --fail: must be none, RANK@WHEN[:KIND][+REJOIN] events" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_random_schedule_is_the_same_for_the_same_spec_and_world_size():
    first = fail_schedule.schedule("mtbf=60s,seed=1", 4)
    assert first == fail_schedule.schedule("mtbf=60s,seed=1", 4)
    # every rank but rank 0 (which writes the result) fails once, at growing times
    assert sorted(e.rank for e in first) == [1, 2, 3]
    times = [e.seconds for e in first]
    assert times == sorted(times) and times[0] > 0
    assert all(e.kind == "kill" and e.step is None and e.rejoin is None for e in first)
    assert first != fail_schedule.schedule("mtbf=60s,seed=2", 4)
    stopped = fail_schedule.schedule("mtbf=60s,seed=1,kind=stop", 4)
    assert [(e.rank, e.seconds) for e in stopped] == [(e.rank, e.seconds) for e in first]
    assert {e.kind for e in stopped} == {"stop"}
    back = fail_schedule.schedule("mtbf=60s,seed=1,rejoin=10s", 4)
    assert [(e.rank, e.seconds) for e in back] == [(e.rank, e.seconds) for e in first]
    assert {e.rejoin for e in back} == {10.0}


def test_a_random_schedule_has_the_mean_time_between_failures_it_was_given():
    events = fail_schedule.schedule("mtbf=60s,seed=3", 2001)
    mean = events[-1].seconds / len(events)
    assert 55 < mean < 65


@pytest.mark.parametrize("spec, world_size, message", [
    ("3@step1", 2, "rank 3 does not exist; this job has ranks 0 to 1"),
    ("0@step1,1@5s", 2, "the schedule fails every rank of this job for good"),
    ("0@step1", 1, "the schedule fails every rank of this job for good"),
    ("1@step1,1@5s", 4, "rank 1 fails twice; after its first failure it is gone for good"),
    ("1@step3+10s", 4, "1@step3:kill+10s rejoins, but there is nothing to rejoin: without "
     "a recovery policy a failure ends the job; leave +10s out"),
    ("mtbf=60s,seed=1", 1, "a random schedule fails every rank but rank 0, which writes the "
     "result; this job has only rank 0"),
    ("mtbf=60s,seed=1,rejoin=5s", 4, "mtbf=60s,seed=1,rejoin=5s rejoins, but there is nothing "
     "to rejoin: without a recovery policy a failure ends the job; leave rejoin=5s out"),
    ("1@step32", 4, "1@step32:kill comes after the run's last step (31: warm-up and timed "
     "steps), so it would never fire"),
])
def test_a_schedule_the_job_cannot_run_is_refused(spec, world_size, message):
    with pytest.raises(UsageError, match="^argument --fail: ") as refused:
        fail_schedule.check(spec, world_size, last_step=31)
    assert message in str(refused.value)


def test_a_schedule_the_job_can_run_passes():
    fail_schedule.check("1@step31,2@45s:stop", 4, last_step=31)
    fail_schedule.check("mtbf=60s,seed=1", 2)
    fail_schedule.check("1@step1000", 2, last_step=None)  # training to accuracy: unknown


@pytest.mark.parametrize("spec, message", [
    ("3@step2", "argument --fail: rank 3 does not exist; this job has ranks 0 to 0"),
    ("0@step2+5s", "argument --fail: 0@step2:kill+5s rejoins, but there is nothing to rejoin"),
    ("0@step99", "argument --fail: 0@step99:kill comes after the run's last step (7: "),
])
def test_the_run_refuses_a_schedule_at_start_up_in_one_line(spec, message, tmp_path):
    done = commbench("run", *TINY_RUN, "--fail", spec, "--results-dir", tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("commbench: error: " + message), done.stderr
