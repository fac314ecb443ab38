"""`--timeline` and the step split through a real launcher: the merged trace file
Perfetto opens, a split whose parts add up to every measured step, a straggler seen
as the others' waiting, and bad paths refused before the run."""

import json
import os
from pathlib import Path

import pytest

from fault_plugins import SLOW_LOG, SLOW_SECONDS
from launchers import TINY_RUN, mpiexec, only_result
from test_spans import check_trace

pytestmark = pytest.mark.mpi
TESTS = str(Path(__file__).resolve().parent)
ENV = {"PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}


def run_job(tmp_path, strategy, *extra, env=None):
    done = mpiexec(2, ["-m", "commbench", f"--dist-optimizer={strategy}", *TINY_RUN,
                       "--results-dir", str(tmp_path / "results"), *extra], timeout=240,
                   env={**ENV, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return done, only_result(tmp_path / "results")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["neighbor_allreduce", "allreduce"])
def test_a_timeline_of_every_rank_and_a_split_that_adds_up(tmp_path, strategy):
    trace_path = tmp_path / "trace.json"
    done, doc = run_job(tmp_path, strategy, "--timeline", str(trace_path))
    assert f"Timeline: {trace_path}" in done.stdout
    assert "Step split (mean per step):" in done.stdout
    trace = json.loads(trace_path.read_text())
    spans_ = check_trace(trace["traceEvents"], 2)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "process_name"}
    assert names[1].startswith("rank 1 (")
    kinds = {(e["pid"], e["cat"]) for e in spans_}
    for rank in (0, 1):
        assert {(rank, k) for k in ("step", "forward", "backward", "optimizer", "comm")} <= kinds
    pieces = [e for e in spans_ if e["cat"] == "comm"]
    assert all(e["tid"] >= 1 and e["args"]["bytes"] > 0 for e in pieces)
    steps = 3 * 2  # --num-iters x --num-batches-per-iter
    assert len([e for e in spans_ if e["cat"] == "step"]) == 2 * steps
    # a decentralized strategy measures its consensus distance after every iteration
    consensus = [e for e in spans_ if e["cat"] == "consensus"]
    assert len(consensus) == (2 * 3 if strategy == "neighbor_allreduce" else 0)

    split, wall = doc["samples"]["step_split"], doc["samples"]["batch_seconds"]
    for rank in (0, 1):
        batches = [b for iteration in wall[rank] for b in iteration]
        assert len(split[rank]) == len(batches) == steps
        for (step, compute, overlapped, exposed, waiting, other, codec, injected), measured \
                in zip(split[rank], batches):
            assert abs(compute + exposed + waiting + other + codec - measured) <= 0.02 * measured
            assert min(compute, overlapped, exposed, waiting) >= 0 and other > -1e-6
            assert compute > 0 and codec == 0 == injected  # nothing compressed, nor slowed
    summary = doc["summary"]["step_split"]
    assert set(summary) == {"step", "compute", "overlapped", "exposed", "waiting", "other",
                            "codec", "injected"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["SlowNeighbor", "SlowAllreduce"])
def test_a_slow_rank_shows_up_as_the_others_waiting(tmp_path, strategy):
    log = tmp_path / "delays"
    _, doc = run_job(tmp_path, f"fault_plugins:{strategy}", env={SLOW_LOG: str(log)})
    split = doc["samples"]["step_split"]
    # what rank 1 slept before each step, scaled to the steps it measured (load included);
    # the measured steps are the last ones (warm-up came first)
    delays = [float(line) for line in log.read_text().split()]
    assert len(delays) >= len(split[1]) and min(delays) >= SLOW_SECONDS, delays
    measured = sorted(delays[-len(split[1]):])
    delay = measured[len(measured) // 2]

    def median(rank, part):
        values = sorted(row[part] for row in split[rank])
        return values[len(values) // 2]

    exposed, waiting, other = 3, 4, 5
    # rank 1 sleeps before each step: rank 0 is blocked for most of it, at first before
    # rank 1 has posted anything (waiting); what follows is the transfer, which may also
    # wait for rank 1 to make progress on it (exposed)
    assert median(0, waiting) > delay / 4, (delays, split[0])
    assert median(0, waiting) + median(0, exposed) > delay / 2, (delays, split[0])
    # the slow rank's sleep is its own, not communication; what it waits for is the
    # scheduling noise of a loaded machine, well below the others' wait
    assert median(1, other) > delay * 0.95, (delays, split[1])
    assert median(1, waiting) < median(0, waiting) / 2, (split[0], split[1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where, message", [
    ("missing/trace.json", "does not exist"),
    (".", "is a directory"),
    ("exists.json", "exists; commbench never overwrites a measurement"),
])
def test_a_bad_timeline_path_is_one_line_before_the_run(tmp_path, where, message):
    (tmp_path / "exists.json").write_text("{}")
    done = mpiexec(2, ["-m", "commbench", *TINY_RUN, "--results-dir", str(tmp_path / "r"),
                       "--timeline", str(tmp_path / where)], timeout=100)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("commbench: error")]
    assert errors and all("argument --timeline: " in e and message in e for e in errors), \
        done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").glob("*.json"))
    assert (tmp_path / "exists.json").read_text() == "{}"


@pytest.mark.timeout(300)
def test_ddp_broadcasts_rank_0s_buffers_unless_told_not_to(tmp_path):
    for flags, broadcast in (([], True), (["--no-broadcast-buffers"], False)):
        trace_path = tmp_path / f"trace-{broadcast}.json"
        done, doc = run_job(tmp_path / str(broadcast), "allreduce", "--timeline",
                            str(trace_path), *flags)
        assert doc["strategy"]["broadcast_buffers"] is broadcast
        assert "broadcast_buffers" not in done.stderr, done.stderr[-2000:]  # no deprecation
        names = {e["name"] for e in json.loads(trace_path.read_text())["traceEvents"]
                 if e.get("cat") == "comm"}
        assert ("broadcast buffers" in names) is broadcast
