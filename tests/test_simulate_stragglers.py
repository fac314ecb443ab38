"""Stragglers made on purpose in a projection (commbench.simulate.stragglers): the
max-plus model of who waits for whom, against what can be worked out by hand."""

import pytest

from commbench.simulate import costs
from commbench.simulate.strategy import Strategy
import numpy as np

from commbench.simulate.stragglers import ALONE, EVERYONE, mean_step, wait_seconds, waits

FOUR = costs.Layout(4, 1)


@pytest.mark.parametrize("strategy", [Strategy("allreduce"), Strategy("horovod"),
                                      Strategy("local_sgd", every=(4,)),
                                      Strategy("neighbor_allreduce"),
                                      Strategy("bluefog.neighbor_allreduce")])
def test_a_rank_always_twice_as_slow_sets_everyones_pace(strategy):
    # whoever waits for it now or through others later runs at its pace: one compute more
    assert wait_seconds(strategy, FOUR, "1:2", 1.0) == pytest.approx(1.0, rel=0.02)


def test_without_a_straggler_or_a_peer_nothing_waits():
    assert wait_seconds(Strategy("allreduce"), FOUR, "none", 1.0) == 0.0
    assert wait_seconds(Strategy("allreduce"), costs.Layout(1, 1), "0:2", 1.0) == 0.0
    # no one waits: the slow rank alone moves fewer images (3 + 1/3 steps per second)
    assert wait_seconds(Strategy("none"), FOUR, "1:3", 1.0) == pytest.approx(4 / (10 / 3) - 1)


def test_an_allreduce_waits_each_step_for_whoever_is_slow_in_it():
    # every rank slowed 2x in 1 step of 4, independently: a step is slow unless none is
    # (1 - 0.75^4 = 0.684 of steps)
    found = wait_seconds(Strategy("allreduce"), FOUR, "0,1,2,3:2@0.25", 1.0)
    assert found == pytest.approx(1 - 0.75 ** 4, abs=0.06)


def test_fewer_meetings_and_fewer_peers_absorb_intermittent_stragglers():
    noisy = "0,1,2,3,4,5,6,7:3@0.2"
    eight = costs.Layout(8, 1)
    every = wait_seconds(Strategy("allreduce"), eight, noisy, 1.0)
    periodic = wait_seconds(Strategy("local_sgd", every=(8,)), eight, noisy, 1.0)
    gossip = wait_seconds(Strategy("neighbor_allreduce"), eight, noisy, 1.0)
    assert 0 < periodic < every and 0 < gossip < every


def test_whom_each_strategy_waits_for():
    assert waits(Strategy("allreduce"), FOUR)(0) is EVERYONE
    periodic = waits(Strategy("local_sgd", every=(4,)), FOUR)
    assert periodic(0) is ALONE and periodic(3) is EVERYONE
    one_peer = waits(Strategy("neighbor_allreduce"), FOUR)
    assert all(len(set(ranks)) == 2 and i in ranks
               for i, ranks in enumerate(one_peer(0).tolist()))
    two_by_two = waits(Strategy("hierarchical_neighbor_allreduce"), costs.Layout(4, 2))
    assert two_by_two(0).tolist() == [[0, 1, 2, 3]] * 4  # one neighbor machine of two
    four_by_two = waits(Strategy("hierarchical_neighbor_allreduce"), costs.Layout(8, 2))
    assert all(len(set(ranks)) == 4 for ranks in four_by_two(0).tolist())  # its + one other


def test_the_max_plus_system_by_hand():
    # two ranks that wait for each other, one 3 s and one 1 s: 3 s a step
    assert mean_step(lambda step: [[0, 1], [0, 1]], np.tile([1.0, 3.0], (10, 1))) == 3.0


def test_the_command_projects_a_straggler_into_every_row_and_says_so(tmp_path):
    from cli_helpers import commbench
    from test_simulate import STATED

    plain = commbench("simulate", *STATED, "--np", "8,16", "--dist-optimizer",
                      "allreduce,local_sgd", "-o", str(tmp_path / "plain"))
    slowed = commbench("simulate", *STATED, "--np", "8,16", "--dist-optimizer",
                       "allreduce,local_sgd", "--slow-ranks", "3:2", "-o",
                       str(tmp_path / "slowed"))
    assert plain.returncode == slowed.returncode == 0, slowed.stderr
    assert "rank 3 2x slower (stragglers on purpose)" in slowed.stdout
    assert "max-plus model of who waits for whom" in " ".join(slowed.stdout.split())

    for strategy in ("allreduce", "local_sgd"):
        before = json_rows(tmp_path / "plain", strategy)
        after = json_rows(tmp_path / "slowed", strategy)
        for n in (8, 16):
            # everyone ends up at the slow rank's pace: one compute more per step
            step = n * 128 / before[n]["img_sec"]
            compute = before[n]["step"]["compute"]
            assert n * 128 / after[n]["img_sec"] == pytest.approx(step + compute, rel=0.02)


def json_rows(directory, strategy):
    import json

    doc = json.loads(next(directory.glob("*.json")).read_text())
    return {r["workers"]: r for r in doc["rows"] if r["strategy"].startswith(strategy)}
