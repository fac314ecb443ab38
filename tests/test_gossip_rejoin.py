"""A rank that rejoins under --recovery gossip (commbench.faults.gossip_rejoin) takes the
survivors' mean: checked against a dense reference, in which the members' mean is kept by
the admission and by every mixing step after it, and the newcomer's in-neighbours' mean
would not have kept it. The admission's protocol in the store
(commbench.faults.gossip_survival), on threads. And, through mpiexec --enable-recovery,
a fresh process in the place of a killed rank admitted by the others."""

import json
from pathlib import Path

import numpy as np
import pytest

from commbench.faults.gossip_rejoin import taken_over
from commbench.faults.gossip_survival import Meeting, Survival
from commbench.topology import build_schedule
from commbench.topology.survivors import survivors_at
from test_gossip_survival import on_threads, store, stores_check
from test_topology import STATIC
from launchers import PYTHON, mpiexec_path, run_once_more_if_the_machine_failed
from test_topology_survivors import DYNAMIC

PROGRAM = Path(__file__).resolve().parent / "programs" / "gossip_rejoin.py"

LOST, FAILS_AT, ADMITTED_AT = 2, 3, 9


def schedules(n):
    """Every static topology, every one-peer schedule, and the inner-outer one, of n."""
    found = [build_schedule(name, n, dynamic=False) for name in STATIC]
    found += [build_schedule(name, n, dynamic=True) for name in DYNAMIC]
    return found + [build_schedule("exponential-2", n, dynamic=True, machine_size=2)]


def mixed(schedule, x, steps):
    """x (a row per rank) after `steps` steps: rank LOST lost at FAILS_AT (its row left as
    it was), admitted again at ADMITTED_AT with the survivors' mean; each step's matrix
    as the members mix along it. The spreads from the mean at each step from then on,
    before it mixes."""
    n = schedule.size
    kept = [r for r in range(n) if r != LOST]
    spreads = []
    for step in range(steps):
        if step == ADMITTED_AT:
            before = x[kept].mean(axis=0)
            x = taken_over(x, [LOST])
            np.testing.assert_allclose(x.mean(axis=0), before, rtol=0, atol=1e-12)
        if FAILS_AT <= step < ADMITTED_AT:
            x[kept] = survivors_at(schedule, [LOST], step).weights @ x[kept]
        else:
            w = schedule.at(step).weights
            np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-12)
            np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
            mean = x.mean(axis=0)
            if step >= ADMITTED_AT:
                spreads.append(np.abs(x - mean).max())
            x = w @ x
            np.testing.assert_allclose(x.mean(axis=0), mean, rtol=0, atol=1e-12)
    return x, spreads


@pytest.mark.parametrize("n", [4, 8])
def test_a_rejoining_rank_keeps_the_members_mean(n):
    for schedule in schedules(n):
        x = np.random.default_rng(n).normal(size=(n, 5)) * np.arange(1, n + 1)[:, None]
        start = np.abs(x - x.mean(axis=0)).max()
        x, spreads = mixed(schedule, x, 400)
        assert spreads[-1] <= 1e-6 * start, schedule.name
        if schedule.dynamic and schedule.name == "exponential-2":  # the default: fast
            assert spreads[60 - ADMITTED_AT] <= 1e-6 * start, schedule.name


def test_an_in_neighbours_average_would_move_the_mean():
    schedule = build_schedule("ring", 8, dynamic=False)
    x = np.random.default_rng(0).normal(size=(8, 3))
    w = schedule.at(ADMITTED_AT).weights
    kept = [r for r in range(8) if r != LOST]
    mean = x[kept].mean(axis=0)
    neighbours = [j for j in kept if w[LOST, j] > 0]
    x[LOST] = x[neighbours].mean(axis=0)
    assert np.abs(x.mean(axis=0) - mean).max() > 1e-3
    np.testing.assert_allclose(taken_over(x, [LOST]).mean(axis=0), mean, rtol=0, atol=1e-12)


def lost_and_met(shared, seconds=5.0):
    """Rank 2 of 4 lost (found by two ranks) and met: the survivors' Survivals."""
    Survival(shared, 1, 4, seconds).announce([2])
    Survival(shared, 3, 4, seconds).announce([2])
    members = {r: Survival(shared, r, 4, seconds) for r in (0, 1, 3)}
    on_threads({r: (lambda s=s: s.meet(7)) for r, s in members.items()})
    return members


def admitted(members, newcomer, step):
    def member(survival):
        return survival.admit(step, survival.decide(step, {"curve": []}))

    return on_threads({**{r: (lambda s=s: member(s)) for r, s in members.items()},
                       2: lambda: newcomer.admitted()[0]})


@stores_check
def test_the_members_admit_a_rank_that_asked_and_all_agree_on_the_meeting():
    shared = store()
    members = lost_and_met(shared)
    assert all(s.lost == (2,) for s in members.values())
    newcomer = Survival(shared, 2, 4, 5.0)
    newcomer.ask()
    met = admitted(members, newcomer, 10)
    assert met == dict.fromkeys((0, 1, 2, 3), Meeting((), (0, 1, 2, 3), 10, joined=(2,)))
    generations = {s.generation for s in [*members.values(), newcomer]}
    assert generations == {2} and not newcomer.news()


@stores_check
def test_a_rank_lost_again_after_its_rejoin_counts_once_more():
    shared = store()
    members = lost_and_met(shared)
    newcomer = Survival(shared, 2, 4, 5.0)
    newcomer.ask()
    admitted(members, newcomer, 10)
    members[1].announce([2])
    members[3].announce([2])  # found twice, counted once
    assert members[0].news()
    met = on_threads({r: (lambda s=s: s.meet(12)) for r, s in members.items()})
    assert met == dict.fromkeys((0, 1, 3), Meeting((2,), (0, 1, 3), 13))
    assert not members[0].news() and members[0].generation == 3


@stores_check
def test_the_members_admit_no_one_who_did_not_ask():
    members = lost_and_met(store())
    decided = on_threads({r: (lambda s=s: s.decide(10, {})) for r, s in members.items()})
    assert decided == dict.fromkeys((0, 1, 3), ())


@stores_check
def test_a_newcomer_waiting_for_a_job_that_ended_stops_in_one_line():
    shared = store()
    lost_and_met(shared)
    newcomer = Survival(shared, 2, 4, 5.0)
    newcomer.ask()
    shared.set("commbench/gossip/ended", "1")
    with pytest.raises(TimeoutError) as error:
        newcomer.admitted()
    assert str(error.value) == ("gossip recovery: the job ended before the members' "
                                "admission of rank 2")


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_fresh_rank_admitted_again_takes_the_survivors_mean_and_keeps_it():
    cmd = [mpiexec_path(), "-n", "4", "--oversubscribe", "--bind-to", "none",
           "--enable-recovery", PYTHON, str(PROGRAM)]
    done = run_once_more_if_the_machine_failed(cmd, 100)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["lost"] == [2]
    mean = facts["mean_at_admission"]
    assert facts["newcomer_took"] == pytest.approx(mean, abs=1e-12)
    assert facts["newcomer_momentum"] == facts["rank_0_momentum"]
    assert facts["mean_at_end"] == pytest.approx(mean, abs=1e-12)
    assert facts["spread_at_end"] < 1e-9
