"""hierarchical_neighbor_allreduce under --recovery gossip (commbench.faults.gossip_machines):
the survivors' machine matrix (commbench.topology.survivors.survivors_machines) against
the ranks' own with the lost ranks bypassed, and the survivors' mean it keeps; through
mpiexec --enable-recovery, the mixer's every step after a loss against that dense
reference, and four ranks on two simulated machines trained on to the planned end after
a machine's leader is lost."""

import json
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import commbench
from commbench.topology import build_schedule, build_topology
from commbench.topology.survivors import survivors_machines
from launchers import PYTHON, mpiexec_path, only_result, run, run_once_more_if_the_machine_failed
from test_gossip_recovery import MPIEXEC, TINY
from test_gossip_survival import stores_check

PROGRAM = Path(__file__).resolve().parent / "programs" / "gossip_machines.py"
HIERARCHICAL = ["--dist-optimizer", "hierarchical_neighbor_allreduce", "--machine-size", "2",
                "--recovery", "gossip", "--cpu-transport", "gloo"]


def ranks_bypassed(machines_w, size, lost):
    """The reference: W_M kron J/size over ranks, each lost rank's senders handing its
    weight on to its receivers (the stochastic complement)."""
    w = np.kron(machines_w, np.full((size, size), 1 / size))
    for rank in sorted(lost, reverse=True):
        kept = [r for r in range(w.shape[0]) if r != rank]
        w = w[np.ix_(kept, kept)] + np.outer(w[kept, rank], w[rank, kept]) / (1 - w[rank, rank])
    return w


CASES = [(build_schedule("exponential-2", 4, True).at(t).weights, 2, lost)
         for t in range(2) for lost in [(1,), (3,), (2, 3), (1, 5), (3, 4, 7)]]
CASES += [(build_topology("ring", 3).weights, 3, lost) for lost in [(4,), (3, 4), (1, 8)]]


@pytest.mark.parametrize("machines_w, size, lost", CASES)
def test_the_machines_matrix_is_the_ranks_bypass_and_keeps_the_survivors_mean(
        machines_w, size, lost):
    machines, m = survivors_machines(machines_w, size, lost)
    kept = [r for r in range(machines_w.shape[0] * size) if r not in lost]
    assert [r for ranks in machines for r in ranks] == kept
    counts = np.array([len(ranks) for ranks in machines])
    # a step: each machine's average, mixed along m, is every one of its ranks' value
    x = np.random.default_rng(len(lost)).normal(size=(len(kept), 5))
    averages = np.stack([x[[kept.index(r) for r in ranks]].mean(axis=0) for ranks in machines])
    mixed = m @ averages
    stepped = np.stack([mixed[a] for a, ranks in enumerate(machines) for _ in ranks])
    np.testing.assert_allclose(stepped, ranks_bypassed(machines_w, size, lost) @ x, atol=1e-12)
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(counts @ m, counts, atol=1e-12)  # the survivors' mean kept
    np.testing.assert_allclose(stepped.mean(axis=0), x.mean(axis=0), atol=1e-12)


def test_with_nothing_lost_it_is_the_machines_own_matrix():
    w = build_schedule("exponential-2", 4, True).at(1).weights
    machines, m = survivors_machines(w, 3, ())
    assert machines == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    np.testing.assert_allclose(m, w, atol=1e-15)


def test_a_machine_with_no_rank_left_drops_out():
    machines, m = survivors_machines(build_topology("ring", 3).weights, 2, (2, 3))
    assert machines == [[0, 1], [4, 5]] and m.shape == (2, 2)


def test_compression_under_hierarchical_gossip_is_refused_in_one_line(tmp_path):
    done = commbench("run", *TINY, *HIERARCHICAL, "--compression", "fp16", "--results-dir",
                     tmp_path, env=MPIEXEC)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0] == (
        "commbench: error: argument --compression: hierarchical_neighbor_allreduce's "
        "survivors send their parameters at full precision; pass --compression none (or "
        "neighbor_allreduce)")


@stores_check
@pytest.mark.mpi
@pytest.mark.timeout(700)
@pytest.mark.parametrize("kind, detected_within", [("kill", 5.0), ("stop", 10.0 + 5.0)])
def test_every_step_after_a_loss_is_the_dense_references(kind, detected_within):
    cmd = [mpiexec_path(), "-n", "6", "--oversubscribe", "--bind-to", "none",
           "--enable-recovery", PYTHON, str(PROGRAM), kind]
    done = run_once_more_if_the_machine_failed(cmd, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["lost"] == [3]
    assert 0 < facts["detection_seconds"] < detected_within
    assert facts["checked"] == 40 - facts["resume_step"] and facts["error"] < 1e-9
    assert facts["mean_at_end"] == pytest.approx(facts["mean_at_meeting"], abs=1e-9)
    assert facts["spread_at_meeting"] > 1.0
    assert facts["spread_at_end"] < 1e-6


@stores_check
@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_survivors_of_a_lost_leader_train_on_to_the_planned_end(tmp_path):
    """Rank 2, the second machine's leader, killed as its 8th step begins: rank 3 leads
    that machine on alone, and the three train the 16 steps."""
    cmd = [mpiexec_path(), "-n", "4", "--oversubscribe", "--bind-to", "none",
           "--enable-recovery", PYTHON, "-m", "commbench", *TINY, *HIERARCHICAL, "--fail",
           "2@step8", "--timeout", "10", "--results-dir", str(tmp_path)]
    done = run(cmd, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    summary, recovery = doc["summary"], doc["recovery"]
    assert (summary["steps"], summary["stopped_by"]) == (16, "max epochs")
    assert recovery["survivors"] == [0, 1, 3]
    assert doc["strategy"]["machine_transport"] == "gloo point-to-point"
    assert (doc["strategy"]["num_machines"], doc["strategy"]["machine_size"]) == (2, 2)
    (cost,) = recovery["costs"]
    assert (cost["rank"], cost["failed_after_step"]) == (2, 7)
    assert 0 < cost["detection_seconds"] <= cost["recovery_seconds"] < 10
    curve = doc["curve"]
    assert curve[-1]["samples"] == 16 * 32 * 4 - 9 * 32
    before = [p for p in curve if p["step"] <= 7][-1]["consensus_distance"]
    assert curve[-1]["consensus_distance"] < before
