"""The survivors' mixing matrix after ranks are lost (commbench.topology.survivors),
checked against a dense reference: every mixing step of every static topology and every
step of the dynamic schedules keeps the survivors' mean, on the links they had."""

import numpy as np
import pytest

from commbench.topology import build_schedule, build_topology
from commbench.topology.survivors import (survivors_at, survivors_schedule, survivors_topology,
                                          survivors_weights, surviving_ranks)
from test_topology import CIRCULANT, STATIC

DYNAMIC = [name for name in CIRCULANT]  # every family with a one-peer schedule
SIZES = [2, 3, 4, 5, 7, 8, 9, 12, 16]


def lost_sets(n):
    """Rank 0, the last rank, and two ranks apart, where the job keeps one at least."""
    found = [{0}, {n - 1}, {1, n // 2}] if n > 2 else [{0}, {1}]
    return [lost for lost in found if len(lost) < n]


def links_around(weights, lost):
    """Which links the survivors may use: their own, and from a sender of a lost rank to
    a receiver of it (through a chain of lost ranks too): the bypass of the hole."""
    kept = surviving_ranks(weights.shape[0], lost)
    gone = sorted(lost)
    linked = weights > 0
    through = np.eye(len(gone), dtype=int)  # lost rank b reaches lost rank a
    for _ in gone:
        through = ((through + linked[np.ix_(gone, gone)].astype(int) @ through) > 0).astype(int)
    around = linked[np.ix_(kept, gone)].astype(int) @ through @ linked[np.ix_(gone, kept)]
    return linked[np.ix_(kept, kept)] | (around > 0)


def check_survivors(weights, lost, w_new, bypass=True):
    """The survivors' matrix is a mixing matrix on the survivors' own links (and those
    around the hole, with bypass), keeps their mean step after step (the dense
    reference), and is symmetric where W was."""
    kept = surviving_ranks(weights.shape[0], lost)
    allowed = links_around(weights, lost) if bypass else weights[np.ix_(kept, kept)] > 0
    assert w_new.shape == (len(kept), len(kept))
    assert (w_new >= 0).all()
    np.testing.assert_allclose(w_new.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w_new.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    off = ~np.eye(len(kept), dtype=bool)
    assert not (w_new[off] > 0)[~allowed[off]].any(), "a link the survivors may not use"
    if np.array_equal(weights, weights.T):
        np.testing.assert_array_equal(w_new, w_new.T)
    x = np.random.default_rng(len(kept)).normal(size=(len(kept), 5))
    mean = x.mean(axis=0)
    for _ in range(3):
        x = w_new @ x
        np.testing.assert_allclose(x.mean(axis=0), mean, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", STATIC)
@pytest.mark.parametrize("n", SIZES)
def test_every_static_topology_keeps_the_survivors_mean(name, n):
    topo = build_topology(name, n)
    for lost in lost_sets(n):
        kept, survived = survivors_topology(topo, lost)
        assert kept == [r for r in range(n) if r not in lost]
        check_survivors(topo.weights, lost, survived.weights)


@pytest.mark.parametrize("name", DYNAMIC)
@pytest.mark.parametrize("n", SIZES)
def test_every_step_of_a_one_peer_schedule_keeps_the_survivors_mean(name, n):
    schedule = build_schedule(name, n, dynamic=True)
    for lost in lost_sets(n):
        for step in range(2 * schedule.period):
            survived = survivors_at(schedule, lost, step)
            check_survivors(schedule.at(step).weights, lost, survived.weights)


@pytest.mark.parametrize("machines, local", [(2, 3), (4, 3), (3, 4)])
def test_every_step_of_the_inner_outer_schedule_keeps_the_survivors_mean(machines, local):
    n = machines * local
    schedule = build_schedule("exponential-2", n, dynamic=True, machine_size=local)
    assert schedule.kind == "inner-outer"
    for lost in lost_sets(n):
        for step in range(2 * schedule.period):
            check_survivors(schedule.at(step).weights, lost,
                            survivors_at(schedule, lost, step).weights)


def test_a_symmetric_topology_gives_the_lost_weight_back_to_the_self_loop():
    ring = build_topology("ring", 6).weights  # weights 1/3 to i-1, i, i+1
    w = survivors_weights(ring, [2])
    third = 1.0 / 3
    # survivors 0, 1, 3, 4, 5: ranks 1 and 3 lost a neighbour, their self-loop took it
    expected = np.array([[third, third, 0, 0, third],
                         [third, 2 * third, 0, 0, 0],
                         [0, 0, 2 * third, third, 0],
                         [0, 0, third, third, third],
                         [third, 0, 0, third, third]])
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-15)


def test_a_symmetric_topology_uses_no_link_around_the_hole():
    for name in ("ring", "mesh-2d", "star", "symmetric-exponential", "fully-connected"):
        w = build_topology(name, 9).weights
        check_survivors(w, [4], survivors_weights(w, [4]), bypass=False)


def test_a_directed_topology_bypasses_the_lost_rank():
    """On exponential-2 the self-loop alone leaves columns off one (rank 2 gave the lost
    rank 3 a quarter of its value and took nothing from it); bypassed, what rank 3 took
    from its senders goes on to its receivers, with its weights."""
    w = build_topology("exponential-2", 8).weights  # i takes 1/4 from i-1, i-2, i-4
    kept = surviving_ranks(8, [3])
    naive = w[np.ix_(kept, kept)].copy()
    naive[np.diag_indices_from(naive)] += 1.0 - naive.sum(axis=1)
    assert np.abs(naive.sum(axis=0) - 1.0).max() > 0.1
    bypassed = survivors_weights(w, [3])
    check_survivors(w, [3], bypassed)
    # rank 4 took 1/4 from rank 3, which took 1/4 from each of 2, 1 and 7 and kept 1/4:
    # 4 now takes 1/4 * 1/4 / (1 - 1/4) = 1/12 more from each of them
    four = kept.index(4)
    assert bypassed[four, kept.index(1)] == pytest.approx(0.0 + 1 / 12)
    assert bypassed[four, kept.index(2)] == pytest.approx(0.25 + 1 / 12)
    assert bypassed[four, kept.index(7)] == pytest.approx(1 / 12)


def test_a_one_peer_step_around_the_hole_stays_a_permutation_averaged_with_itself():
    schedule = build_schedule("ring", 6, dynamic=True)  # i takes 1/2 from i-1 or i+1
    w = survivors_at(schedule, [2], 0).weights
    np.testing.assert_allclose(np.diag(w), 0.5, rtol=0, atol=1e-15)
    off = w - np.diag(np.diag(w))
    assert ((np.abs(off - 0.5) < 1e-15).sum(axis=0) == 1).all()  # one sender each
    assert ((np.abs(off - 0.5) < 1e-15).sum(axis=1) == 1).all()  # one receiver each


@pytest.mark.parametrize("name", ["exponential-2", "ring", "mesh-2d", "star"])
def test_survivors_that_stay_connected_still_reach_their_mean(name):
    w = survivors_weights(build_topology(name, 9).weights, [4])
    x = np.random.default_rng(0).normal(size=(8, 3))
    mean = x.mean(axis=0)
    for _ in range(500):
        x = w @ x
    np.testing.assert_allclose(x, np.broadcast_to(mean, x.shape), rtol=0, atol=1e-8)


def test_a_one_peer_schedule_around_the_hole_still_reaches_the_mean():
    schedule = build_schedule("exponential-2", 8, dynamic=True)
    x = np.random.default_rng(1).normal(size=(7, 3))
    mean = x.mean(axis=0)
    for step in range(600):
        x = survivors_at(schedule, [5], step).weights @ x
    np.testing.assert_allclose(x, np.broadcast_to(mean, x.shape), rtol=0, atol=1e-8)


def test_the_survivors_schedule_mixes_each_step_as_survivors_at_does():
    schedule = build_schedule("exponential-2", 8, dynamic=True)
    survived = survivors_schedule(schedule, [5, 2])
    assert (survived.name, survived.size, survived.kind, survived.period) == (
        schedule.name, 6, schedule.kind, schedule.period)
    for step in range(2 * schedule.period):
        np.testing.assert_array_equal(survived.at(step).weights,
                                      survivors_at(schedule, [5, 2], step).weights)


@pytest.mark.parametrize("lost, message", [([0, 1, 2], "every one of the 3 workers is lost"),
                                           ([3], r"lost ranks \[3\] are not all among 3")])
def test_losing_every_rank_or_one_that_is_not_there_is_an_error(lost, message):
    with pytest.raises(ValueError, match=message):
        survivors_weights(build_topology("ring", 3).weights, lost)
