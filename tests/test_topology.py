"""Mixing matrices: stochasticity, neighbor lists, spectral gaps, dynamic schedules.

Bluefog's graphs are ported below (without networkx) as references; they store
the transpose of our W (edge i -> j carries the weight j gives to i).
"""

import math

import numpy as np
import pytest

from commbench.errors import UsageError
from commbench.topology import (
    DEFAULT_TOPOLOGY,
    TOPOLOGY_NAMES,
    Topology,
    TopologyError,
    build_schedule,
    build_topology,
    describe,
    mesh_shape,
)

STATIC = ["exponential-2", "exponential-3", "exponential-5", "symmetric-exponential",
          "symmetric-exponential-2", "ring", "ring-left", "ring-right", "mesh-2d", "star",
          "fully-connected"]
CIRCULANT = [name for name in STATIC if name not in ("mesh-2d", "star")]
SIZES = range(1, 17)


def rebuilt(topo: Topology) -> np.ndarray:
    """W put back together from the neighbor lists alone."""
    w = np.zeros((topo.size, topo.size))
    for i in range(topo.size):
        w[i, i] = topo.self_weight(i)
        for j, weight in topo.in_neighbors(i).items():
            w[i, j] = weight
    return w


def second_largest_modulus(eigenvalues) -> float:
    return sorted(np.abs(eigenvalues))[-2]


# --- Bluefog's static graphs, ported (topo[i] = roll(x, i): i sends to i + k) ---


def bluefog_circulant(x):
    x = np.asarray(x, dtype=float)
    x = x / x.sum()
    return np.array([np.roll(x, i) for i in range(len(x))])


def bluefog_exponential_two(n):
    return bluefog_circulant([1.0 if i & (i - 1) == 0 else 0.0 for i in range(n)])


def bluefog_symmetric_exponential(n, base=4):
    def is_power(x):  # Bluefog's float check; exact for the sizes used below
        return base ** int(math.log(x, base)) == x
    return bluefog_circulant(
        [1.0] + [1.0 if is_power(i if i <= n // 2 else n - i) else 0.0 for i in range(1, n)])


def bluefog_ring(n, style):  # 0 bidirectional, 1 left, 2 right
    if n <= 2:
        return np.full((n, n), 1.0 / n)
    x = np.zeros(n)
    x[0] = 0.5
    if style == 0:
        x[[0, 1, -1]] = 1 / 3
    else:
        x[-1 if style == 1 else 1] = 0.5
    return np.array([np.roll(x, i) for i in range(n)])


def bluefog_star(n):
    topo = np.zeros((n, n))
    for i in range(n):
        topo[i, i] = 1 - 1 / n
        topo[0, i] = 1 / n
        topo[i, 0] = 1 / n
    return topo


def bluefog_mesh(n):
    rows = int(np.sqrt(n))
    while n % rows:
        rows -= 1
    cols = n // rows
    topo = np.zeros((n, n))
    for i in range(n):
        topo[i][i] = 1.0
        if (i + 1) % cols != 0:
            topo[i][i + 1] = topo[i + 1][i] = 1.0
        if i + cols < n:
            topo[i][i + cols] = topo[i + cols][i] = 1.0
    nbrs = [np.nonzero(topo[i])[0] for i in range(n)]
    for i in range(n):
        for j in nbrs[i]:
            if i != j:
                topo[i][j] = 1.0 / max(len(nbrs[i]), len(nbrs[j]))
        topo[i][i] = 2.0 - topo[i].sum()
    return topo


BLUEFOG = {
    "exponential-2": bluefog_exponential_two,
    "symmetric-exponential": bluefog_symmetric_exponential,
    "ring": lambda n: bluefog_ring(n, 0),
    "ring-left": lambda n: bluefog_ring(n, 1),
    "ring-right": lambda n: bluefog_ring(n, 2),
    "mesh-2d": bluefog_mesh,
    "star": bluefog_star,
    "fully-connected": lambda n: np.full((n, n), 1.0 / n),
}


@pytest.mark.parametrize("name", sorted(BLUEFOG))
@pytest.mark.parametrize("n", range(1, 33))
def test_matches_bluefog_graph(name, n):
    np.testing.assert_allclose(build_topology(name, n).weights, BLUEFOG[name](n).T, atol=1e-15)


# --- every static topology ---------------------------------------------------


@pytest.mark.parametrize("name", STATIC)
@pytest.mark.parametrize("n", SIZES)
def test_static_topology_is_a_proper_mixing_matrix(name, n):
    topo = build_topology(name, n)
    w = topo.weights
    assert topo.name == name and topo.size == n and w.shape == (n, n)
    assert (w >= 0).all()
    assert topo.is_doubly_stochastic()  # star included: Bluefog's star is symmetric
    np.testing.assert_array_equal(rebuilt(topo), w)
    for j in range(n):
        assert topo.out_neighbors(j) == {i: w[i, j] for i in range(n) if i != j and w[i, j]}
        assert list(topo.in_neighbors(j)) == sorted(topo.in_neighbors(j))
    if n == 1:
        assert topo.spectral_gap == 1.0
    else:  # all of these are connected with self-loops: they reach consensus
        assert 0.0 < topo.spectral_gap <= 1.0 + 1e-12


def test_n1_is_identity_everywhere():
    for name in STATIC:
        np.testing.assert_array_equal(build_topology(name, 1).weights, [[1.0]])
        assert build_topology(name, 1).in_neighbors(0) == {}


def test_weights_are_read_only():
    topo = build_topology("ring", 4)
    with pytest.raises(ValueError):
        topo.weights[0, 0] = 0.0


@pytest.mark.parametrize("n", range(2, 65))
def test_exponential_2_spectral_gap(n):
    # Ying et al. 2021: 2/(1+tau), tau = log2 n, for n = 2^tau. Beyond powers of two,
    # with tau = ceil(log2 n) (the in-degree): equality for every even n (the
    # eigenvalue at frequency n/2 is (tau-1)/(tau+1)), a strictly larger gap for odd n.
    topo = build_topology("exponential-2", n)
    tau = math.ceil(math.log2(n))
    assert len(topo.in_neighbors(0)) == tau
    closed_form = 2 / (1 + tau)
    if n % 2 == 0:
        assert topo.spectral_gap == pytest.approx(closed_form, abs=1e-12)
    else:
        assert topo.spectral_gap > closed_form + 1e-3


@pytest.mark.parametrize("tau", range(1, 8))
def test_exponential_2_power_of_two_closed_form(tau):
    assert build_topology("exponential-2", 2 ** tau).spectral_gap == pytest.approx(2 / (1 + tau))


@pytest.mark.parametrize("n", range(3, 17))
def test_closed_form_gaps_of_rings_star_and_full(n):
    k = np.arange(1, n)
    ring = second_largest_modulus(np.r_[1.0, (1 + 2 * np.cos(2 * np.pi * k / n)) / 3])
    assert build_topology("ring", n).spectral_gap == pytest.approx(1 - ring)
    for name in ("ring-left", "ring-right"):
        assert build_topology(name, n).spectral_gap == pytest.approx(1 - math.cos(math.pi / n))
    assert build_topology("star", n).spectral_gap == pytest.approx(1 / n)  # eigenvalues 1, 0, 1-1/n
    assert build_topology("fully-connected", n).spectral_gap == pytest.approx(1.0)


def test_exponential_base_uses_integer_powers():
    # Float logs say 243 is not a power of 3 (log(243, 3) = 4.999...): the trap avoided.
    assert 3 ** int(math.log(243, 3)) != 243
    topo = build_topology("exponential-3", 244)
    assert sorted(topo.out_neighbors(0)) == [1, 3, 9, 27, 81, 243]
    assert topo.in_neighbors(0) == {(0 - k) % 244: 1 / 7 for k in (1, 3, 9, 27, 81, 243)}
    assert 243 not in build_topology("exponential-3", 243).out_neighbors(0)


def test_exponential_base_above_size_is_a_ring():
    np.testing.assert_array_equal(build_topology("exponential-7", 5).weights,
                                  build_topology("ring-right", 5).weights)


@pytest.mark.parametrize("n", [5, 12, 17, 20, 33])
def test_symmetric_exponential_shifts(n):
    topo = build_topology("symmetric-exponential", n)
    expected = sorted(k for k in range(1, n) if min(k, n - k) in (1, 4, 16, 64))
    assert sorted(topo.out_neighbors(0)) == expected
    np.testing.assert_array_equal(topo.weights, topo.weights.T)
    base2 = build_topology("symmetric-exponential-2", n)
    assert sorted(base2.out_neighbors(0)) == sorted(
        k for k in range(1, n) if min(k, n - k) in (1, 2, 4, 8, 16))


def test_ring_weights_and_n2():
    assert build_topology("ring", 5).in_neighbors(0) == pytest.approx({1: 1 / 3, 4: 1 / 3})
    # n = 2: shifts 1 and n-1 are the same neighbor; one link, weights 1/2 (as Bluefog).
    np.testing.assert_array_equal(build_topology("ring", 2).weights, [[0.5, 0.5], [0.5, 0.5]])
    # ring-left sends to i-1 and receives from i+1 (Bluefog's connect_style=1).
    assert build_topology("ring-left", 5).out_neighbors(2) == {1: 0.5}
    assert build_topology("ring-left", 5).in_neighbors(2) == {3: 0.5}
    assert build_topology("ring-right", 5).in_neighbors(2) == {1: 0.5}


@pytest.mark.parametrize("n,shape", [(1, (1, 1)), (2, (1, 2)), (6, (2, 3)), (7, (1, 7)),
                                     (12, (3, 4)), (16, (4, 4)), (24, (4, 6)), (36, (6, 6))])
def test_mesh_shape(n, shape):
    assert mesh_shape(n) == shape


def test_mesh_2d_links_and_metropolis_weights():
    topo = build_topology("mesh-2d", 6)  # 2 x 3: 0 1 2 / 3 4 5
    assert topo.in_neighbors(0) == pytest.approx({1: 1 / 4, 3: 1 / 3})
    assert topo.in_neighbors(4) == pytest.approx({1: 1 / 4, 3: 1 / 4, 5: 1 / 4})
    assert topo.self_weight(0) == pytest.approx(1 - 1 / 4 - 1 / 3)
    assert 2 not in topo.in_neighbors(3) and 3 not in topo.in_neighbors(2)  # no wrap-around


def test_star_weights():
    topo = build_topology("star", 5)
    assert topo.self_weight(0) == pytest.approx(0.2)
    assert topo.in_neighbors(0) == pytest.approx({1: 0.2, 2: 0.2, 3: 0.2, 4: 0.2})
    assert topo.in_neighbors(3) == pytest.approx({0: 0.2}) and topo.self_weight(3) == 0.8


# --- schedules ---------------------------------------------------------------


def product(schedule, start, steps):
    w = np.eye(schedule.size)
    for t in range(start, start + steps):
        w = schedule.at(t).weights @ w
    return w


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_peer_exponential_2_averages_exactly(n):
    m = int(math.log2(n))
    schedule = build_schedule("exponential-2", n, dynamic=True)
    assert schedule.dynamic and schedule.kind == "one-peer" and schedule.period == m
    for t in range(2 * m):
        topo = schedule.at(t)
        for i in range(n):
            assert topo.out_neighbors(i) == {(i + 2 ** (t % m)) % n: 0.5}
            assert topo.in_neighbors(i) == {(i - 2 ** (t % m)) % n: 0.5}
            assert topo.self_weight(i) == 0.5
    for start in range(m):  # any m consecutive steps
        np.testing.assert_allclose(product(schedule, start, m), np.full((n, n), 1 / n), atol=1e-15)


def test_one_peer_is_not_exact_below_log2_steps():
    schedule = build_schedule("exponential-2", 8, dynamic=True)
    assert not np.allclose(product(schedule, 0, 2), 1 / 8)


@pytest.mark.parametrize("name", CIRCULANT)
@pytest.mark.parametrize("n", SIZES)
def test_one_peer_on_circulant_graphs(name, n):
    static = build_topology(name, n)
    schedule = build_schedule(name, n, dynamic=True)
    assert schedule.period == max(1, len(static.out_neighbors(0)))
    used = np.zeros((n, n), dtype=bool)
    for t in range(schedule.period):
        topo = schedule.at(t)
        assert topo.is_doubly_stochastic()
        for i in range(n):
            assert len(topo.out_neighbors(i)) == (n > 1) == len(topo.in_neighbors(i))
        used |= topo.weights > 0
    # Over one period every link of the static graph is used, and nothing else.
    np.testing.assert_array_equal(used, static.weights > 0)


def test_one_peer_cycles_out_neighbors_clockwise():
    schedule = build_schedule("ring", 5, dynamic=True)  # shifts 1, 4
    assert [list(schedule.at(t).out_neighbors(3)) for t in range(3)] == [[4], [2], [4]]


@pytest.mark.parametrize("machines", range(1, 10))
def test_machine_level_schedule_is_bluefogs_exp2_machine_schedule(machines):
    # GetExp2DynamicSendRecvMachineRanks: machine m sends to m + 2^(t mod (floor(log2(M-1))+1)).
    schedule = build_schedule("exponential-2", machines, dynamic=True)
    levels = int(np.log2(machines - 1)) + 1 if machines > 1 else 1
    for t in range(3 * levels):
        for m in range(machines):
            dist = 2 ** (t % levels)
            expected = {} if machines == 1 else {(m + dist) % machines: 0.5}
            assert schedule.at(t).out_neighbors(m) == expected
    assert build_schedule("exponential-2", machines, dynamic=False).at(7).weights.tolist() == \
        build_topology("exponential-2", machines).weights.tolist()


def bluefog_inner_outer(world, local, rank, step):
    """GetInnerOuterExpo2DynamicSendRecvRanks' arithmetic for one rank and step: (send, recv)."""
    machines = world // local
    out_size = int(np.log2(machines - 1))
    in_size = int(np.log2(local - 2))
    machine, lrank = divmod(rank, local)
    outside = step % local
    if outside == lrank:
        dist = 2 ** (step % (out_size + 1))
        return ((machine + dist) % machines * local + lrank,
                (machine - dist) % machines * local + lrank)
    dist = 2 ** (step % (in_size + 1))
    send_dist = dist + 1 if dist >= (outside - lrank) % local else dist
    recv_dist = dist + 1 if dist >= (lrank - outside) % local else dist
    return (machine * local + (lrank + send_dist) % local,
            machine * local + (lrank - recv_dist) % local)


@pytest.mark.parametrize("machines", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("local", [3, 4, 5, 6, 8])
def test_inner_outer_matches_bluefog(machines, local):
    n = machines * local
    schedule = build_schedule("exponential-2", n, dynamic=True, machine_size=local)
    assert schedule.kind == "inner-outer"
    for t in range(2 * schedule.period + 1):
        topo = schedule.at(t)
        assert topo.is_doubly_stochastic()
        for r in range(n):
            send, recv = bluefog_inner_outer(n, local, r, t)
            assert topo.out_neighbors(r) == {send: 0.5}
            assert topo.in_neighbors(r) == {recv: 0.5}
    # Connected over a period: the product contracts towards the average.
    p = product(schedule, 0, schedule.period)
    assert np.linalg.norm(p - 1 / n, 2) < 1 - 1e-6


def test_inner_outer_hand_computed_4_machines_of_3():
    # Rank r = 3m + l. Machine hop cycles 1, 2 (floor(log2 3) + 1 = 2 levels);
    # the outside local rank is t mod 3; the two inner ranks of each machine swap.
    schedule = build_schedule("exponential-2", 12, dynamic=True, machine_size=3)
    assert schedule.period == 6
    sources = {
        0: {0: 9, 3: 0, 6: 3, 9: 6, 1: 2, 2: 1, 4: 5, 5: 4, 7: 8, 8: 7, 10: 11, 11: 10},
        1: {1: 7, 4: 10, 7: 1, 10: 4, 0: 2, 2: 0, 3: 5, 5: 3, 6: 8, 8: 6, 9: 11, 11: 9},
        2: {2: 11, 5: 2, 8: 5, 11: 8, 0: 1, 1: 0, 3: 4, 4: 3, 6: 7, 7: 6, 9: 10, 10: 9},
        3: {0: 6, 3: 9, 6: 0, 9: 3, 1: 2, 2: 1, 4: 5, 5: 4, 7: 8, 8: 7, 10: 11, 11: 10},
    }
    for t, src in sources.items():
        expected = 0.5 * np.eye(12)
        for r, s in src.items():
            expected[r, s] = 0.5
        np.testing.assert_array_equal(schedule.at(t).weights, expected)


def test_two_ranks_per_machine_uses_one_peer():
    # Bluefog refuses local size 2; its rule would never mix a machine's two ranks.
    # 4 machines x 2 ranks: the one-peer exponential-2 schedule on all 8 ranks.
    schedule = build_schedule("exponential-2", 8, dynamic=True, machine_size=2)
    assert schedule.kind == "one-peer" and schedule.period == 3
    for t, hop in [(0, 1), (1, 2), (2, 4), (3, 1)]:
        expected = 0.5 * np.eye(8)
        for i in range(8):
            expected[i, (i - hop) % 8] = 0.5
        np.testing.assert_array_equal(schedule.at(t).weights, expected)


def test_one_machine_or_one_rank_per_machine_uses_one_peer():
    flat = build_schedule("exponential-2", 8, dynamic=True)
    for local in (1, 8):
        schedule = build_schedule("exponential-2", 8, dynamic=True, machine_size=local)
        assert schedule.kind == "one-peer"
        for t in range(4):
            np.testing.assert_array_equal(schedule.at(t).weights, flat.at(t).weights)


def test_other_topologies_keep_their_own_schedule_on_several_machines():
    schedule = build_schedule("ring", 12, dynamic=True, machine_size=4)
    assert schedule.kind == "one-peer" and schedule.name == "ring"


def test_static_schedule():
    schedule = build_schedule("mesh-2d", 6, dynamic=False, machine_size=3)
    assert not schedule.dynamic and schedule.period == 1
    assert schedule.at(0) is schedule.at(41)
    np.testing.assert_array_equal(schedule.at(3).weights, build_topology("mesh-2d", 6).weights)
    with pytest.raises(ValueError):
        schedule.at(-1)


# --- errors and listing ------------------------------------------------------


def test_unknown_name_lists_accepted_names():
    with pytest.raises(TopologyError) as err:
        build_topology("hypercube", 4)
    message = str(err.value)
    assert "'hypercube'" in message
    for name in ("exponential-2", "exponential-<b>", "symmetric-exponential", "ring-left",
                 "mesh-2d", "star", "fully-connected"):
        assert name in message
    assert "\n" not in message
    assert isinstance(err.value, UsageError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("name", ["exponential-1", "exponential-0", "exponential-x",
                                  "exponential-", "symmetric-exponential-1", "exponential--2"])
def test_bad_base(name):
    with pytest.raises(TopologyError, match="base must be an integer >= 2"):
        build_topology(name, 4)


@pytest.mark.parametrize("name", ["exponential", "Ring", "ring ", "symmetric-exponential2"])
def test_near_miss_names_are_unknown(name):
    with pytest.raises(TopologyError, match="unknown topology"):
        build_topology(name, 4)


@pytest.mark.parametrize("size", [0, -3, 2.0, "4", True, None])
def test_bad_size(size):
    with pytest.raises(TopologyError, match="positive integer"):
        build_topology("ring", size)


@pytest.mark.parametrize("name", ["star", "mesh-2d"])
def test_no_dynamic_schedule(name):
    with pytest.raises(TopologyError) as err:
        build_schedule(name, 8, dynamic=True)
    assert str(err.value) == (
        f"topology '{name}' has no dynamic schedule; pass --disable-dynamic-topology")
    assert build_schedule(name, 8, dynamic=False).kind == "static"


@pytest.mark.parametrize("machine_size", [3, 0, -2, 16])
def test_machine_size_must_divide_size(machine_size):
    with pytest.raises(TopologyError, match="ranks per machine"):
        build_schedule("exponential-2", 8, dynamic=True, machine_size=machine_size)


def test_describe_covers_every_name():
    rows = describe()
    assert [row.name for row in rows] == list(TOPOLOGY_NAMES)
    assert TOPOLOGY_NAMES[0] == DEFAULT_TOPOLOGY == "exponential-2"
    assert {row.name for row in rows if not row.has_dynamic} == {"mesh-2d", "star"}
    assert all(row.description and "\n" not in row.description for row in rows)
    for row in rows:  # every listed name (with b = 3) builds, and dynamic iff listed so
        name = row.name.replace("<b>", "3")
        assert build_topology(name, 5).size == 5
        if row.has_dynamic:
            assert build_schedule(name, 5, dynamic=True).dynamic
        else:
            with pytest.raises(TopologyError):
                build_schedule(name, 5, dynamic=True)
