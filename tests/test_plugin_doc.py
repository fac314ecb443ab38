"""docs/plugins.md's complete strategy, taken from the doc's own text and run under
`mpiexec -n 2`: a strategy written from the doc alone records its bytes on the wire,
its step split and its timeline."""

import json

import pytest

from launchers import TINY_RUN, mpiexec, only_result
from test_training_step import documented_strategy

pytestmark = [pytest.mark.job, pytest.mark.mpi]


def test_the_documented_strategy_records_its_bytes_split_and_timeline(tmp_path):
    source = documented_strategy()
    assert len(source.splitlines()) <= 40
    (tmp_path / "documented.py").write_text(source)
    results, timeline = tmp_path / "results", tmp_path / "timeline.json"
    done = mpiexec(2, ["-m", "commbench", "--dist-optimizer", "documented:PeriodicAverage",
                       "--results-dir", str(results), "--timeline", str(timeline),
                       *TINY_RUN], timeout=300, env={"PYTHONPATH": str(tmp_path)},
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(results)
    summary = doc["summary"]
    assert "wire_unrecorded" not in summary
    # Every 4th step (the option's default; the warm-up step counts) each rank sent the
    # ring's share of every parameter: one of TINY_RUN's 6 measured steps.
    sent = doc["samples"]["sent_bytes"]
    averaged = [step for step, nbytes in enumerate(sent[0]) if nbytes]
    assert len(averaged) == 1 and sent[0] == sent[1] and len(sent[0]) == 6
    nbytes = sent[0][averaged[0]]
    assert summary["wire"]["bytes_per_communicating_step"] == nbytes
    # The step split, with the averaging step's and the others' apart.
    assert summary["step_split"]["step"]["mean"] > 0
    assert set(summary["step_split_by_steps"]) == {"communicating", "local"}
    # The timeline holds the piece on both ranks, with the bytes it carried: on 2 ranks
    # a ring allreduce of S bytes sends S.
    events = json.loads(timeline.read_text())["traceEvents"]
    pieces = [e for e in events if e.get("cat") == "comm"]
    assert sorted(e["pid"] for e in pieces) == [0, 1]
    assert all(e["name"] == "parameter average" for e in pieces)
    assert all(e["args"]["bytes"] == nbytes for e in pieces)
    assert "On the wire (sent per rank)" in done.stdout
