"""The step split and the timeline from recorded spans (commbench.timing.spans,
commbench.timing.step_split, commbench.timing.trace_file), on spans made by hand: parts that add up
to the step, a late peer seen as waiting, overlap, the trace-event format."""

import pytest

from commbench.timing import failure_track, spans, trace_file
from commbench.timing.spans import Span
from commbench.timing.step_split import PARTS, split_steps, summarize
from commbench.timing.trace_file import trace_events


def step_events(step, start, forward, backward, wait, optimizer, post=None, peers=None,
                done=None):
    """One rank's spans of one step: phases back to back from start, a piece posted at
    `post` (default: when backward begins) and complete at `done`."""
    t = start
    events = []
    for kind, seconds in (("forward", forward), ("backward", backward), ("wait", wait),
                          ("optimizer", optimizer)):
        events.append(Span(step, kind, t, t + seconds))
        if kind == "forward":
            piece_at = t + seconds if post is None else post
        if kind == "wait":
            piece_done = t + seconds if done is None else done
        t += seconds
    events.append(Span(step, "comm", piece_at, piece_done, name="piece", nbytes=1024,
                       peers=peers))
    events.append(Span(step, "step", start, t + 0.001))
    return events


def test_parts_add_up_and_a_late_peer_is_waiting_not_transfer():
    # rank 1 starts 0.05 s late; rank 0 blocks 0.07 s after its backward
    rank0 = step_events(0, 0.0, 0.01, 0.02, 0.07, 0.005)
    rank1 = step_events(0, 0.05, 0.01, 0.02, 0.02, 0.005)
    (row0,), (row1,) = split_steps([rank0, rank1], [0.0, 0.0])
    parts = dict(zip(PARTS, row0))
    assert parts["step"] == pytest.approx(0.106)
    assert parts["compute"] == pytest.approx(0.035)
    # blocked from 0.03 to 0.10; rank 1 posted its piece at 0.06: 0.03 waiting, 0.04 exposed
    assert parts["waiting"] == pytest.approx(0.03)
    assert parts["exposed"] == pytest.approx(0.04)
    assert parts["other"] == pytest.approx(0.001)
    assert parts["overlapped"] == pytest.approx(0.02)  # the piece ran during backward
    assert sum(row0[1:]) - row0[2] == pytest.approx(row0[0])
    assert dict(zip(PARTS, row1))["waiting"] == 0.0


def test_clock_offsets_put_ranks_on_one_clock():
    rank0 = step_events(0, 0.0, 0.01, 0.02, 0.07, 0.005)
    rank1 = step_events(0, 100.05, 0.01, 0.02, 0.02, 0.005)  # its clock runs 100 s ahead
    (row,), _ = split_steps([rank0, rank1], [0.0, -100.0])
    assert dict(zip(PARTS, row))["waiting"] == pytest.approx(0.03)


def test_only_the_peers_a_piece_involves_make_a_rank_wait():
    rank0 = step_events(0, 0.0, 0.01, 0.02, 0.07, 0.005, peers=[1])
    rank1 = step_events(0, 0.0, 0.01, 0.02, 0.07, 0.005, peers=[0])
    rank2 = step_events(0, 0.05, 0.01, 0.02, 0.02, 0.005, peers=[1])
    rows = split_steps([rank0, rank1, rank2], [0.0] * 3)
    assert dict(zip(PARTS, rows[0][0]))["waiting"] == 0.0  # rank 2 is not its peer


def test_a_step_without_phases_has_no_split_and_none_is_summarized():
    events = [Span(0, "step", 0.0, 0.1)]
    assert split_steps([events], [0.0]) == [[[]]]
    assert summarize([[[]]]) is None


def test_the_summary_means_add_up_to_the_step():
    rows = [[step_events(s, s, 0.01, 0.02 + s / 100, 0.01, 0.005) for s in range(5)]]
    split = split_steps([[e for step in rows[0] for e in step]], [0.0])
    summary = summarize(split)
    mean = {part: summary[part]["mean"] for part in PARTS}
    assert mean["compute"] + mean["exposed"] + mean["waiting"] + mean["other"] == \
        pytest.approx(mean["step"])
    assert summary["compute"]["p10"] <= summary["compute"]["median"] <= summary["compute"]["p90"]


def check_trace(trace, ranks):
    """The trace-event format: complete events with non-negative durations, one process
    per rank, spans on one track nested properly."""
    assert {e["pid"] for e in trace} == set(range(ranks))
    names = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    assert len(names) == ranks
    spans_ = [e for e in trace if e["ph"] == "X"]
    assert spans_ and all(e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["tid"], int)
                          for e in spans_)
    for track in {(e["pid"], e["tid"]) for e in spans_}:
        open_ends = []
        for e in sorted((e for e in spans_ if (e["pid"], e["tid"]) == track),
                        key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= e["ts"] + 1e-6:
                open_ends.pop()
            assert not open_ends or e["ts"] + e["dur"] <= open_ends[-1] + 1e-6, track
            open_ends.append(e["ts"] + e["dur"])
    return spans_


def test_trace_events_nest_and_overlapping_pieces_get_their_own_track():
    events = step_events(0, 0.0, 0.01, 0.02, 0.07, 0.005)
    events.append(Span(0, "comm", 0.011, 0.05, name="second piece", nbytes=10, peers=[1]))
    # (it overlaps the first)
    trace = trace_events([events], [0.0], ["rank 0 (host)"])
    spans_ = check_trace(trace, 1)
    tracks = {e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert tracks == {"compute", "communication", "communication 2"}
    assert min(e["ts"] for e in spans_) == 0
    piece = next(e for e in spans_ if e["name"] == "second piece")
    assert piece["args"] == {"step": 0, "bytes": 10, "peers": [1]}


def test_a_trace_keeps_the_last_steps_it_is_asked_for():
    events = [e for s in range(10) for e in step_events(s, s, 0.01, 0.02, 0.07, 0.005)]
    trace = trace_events([events], [0.0], ["rank 0"], steps=3)
    assert {e["args"]["step"] for e in trace if e["ph"] == "X"} == {7, 8, 9}


def test_what_a_plugin_records_is_kept_only_inside_a_measured_step():
    recorder = spans.Recorder()
    assert spans.record("forward", 0.0, 1.0) is None and not spans.recording()
    with recorder.measured_step():
        assert spans.recording()
        event = spans.record("comm", 0.0)
        spans.close(event)
    assert spans.record("forward", 0.0, 1.0) is None and not spans.recording()
    assert recorder.events == [event] and event.step == 0 and event.end > 0


def test_work_between_steps_is_recorded_from_the_first_step_and_a_window_is_kept():
    recorder = spans.Recorder()
    with recorder.between("consensus"):
        pass
    assert recorder.events == []  # before any measured step: warm-up is no one's
    for step in range(5):
        with recorder.measured_step():
            recorder.add("step", step, step + 0.5)
        with recorder.between("evaluate"):
            assert spans.record("comm", 0.0) is None  # between steps: no step's
    recorder.keep_last(2)
    assert [(e.step, e.kind) for e in recorder.events] == [
        (3, "step"), (3, "evaluate"), (4, "step"), (4, "evaluate")]
    split = split_steps([recorder.events], [0.0])
    assert split == [[[], []]]  # steps without compute phases; evaluate is in none


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp, "is a directory"),
    (lambda tmp: tmp / "missing" / "trace.json", "does not exist"),
])
def test_a_timeline_path_that_cannot_be_written_is_refused(tmp_path, make, message):
    with pytest.raises(OSError, match=message):
        trace_file.check_writable(str(make(tmp_path)))


def test_a_failure_and_its_recovery_are_spans_of_their_own_on_the_failing_ranks_track():
    # rank 1 fired 1@step3:kill at 2.5 s on rank 0's clock (wall 1002.5, clock 1000 behind)
    events = [[e for s in range(5) for e in step_events(s, s, 0.01, 0.02, 0.07, 0.005)]] * 2
    costs = [{"event": "1@step3:kill", "rank": 1, "failed_after_step": 2, "failed_at": 1002.5,
              "detection_seconds": 0.5, "recovery_seconds": 1.25, "steps_lost": 1},
             {"event": "2@1s:kill", "rank": 2, "failed_after_step": 0}]  # no failed_at
    failures = failure_track.from_costs(costs, -1000.0)
    assert [f.event for f in failures] == ["1@step3:kill"]
    trace = trace_events(events, [0.0, 0.0], ["rank 0", "rank 1"], failures=failures)
    check_trace(trace, 2)
    mine = [e for e in trace if e.get("cat") == "failure"]
    assert [(e["ph"], e["name"], e["pid"], e["ts"], e.get("dur")) for e in mine] == [
        ("i", "failure 1@step3:kill", 1, 2.5e6, None),
        ("X", "recovery: to the first complete step after it", 1, 2.5e6, 1.25e6),
        ("X", "detection", 1, 2.5e6, 0.5e6)]  # nested in the recovery
    assert {e["tid"] for e in mine} == {failure_track.TID}
    assert {"name": failure_track.TRACK} in [e["args"] for e in trace
                                             if e["name"] == "thread_name" and e["pid"] == 1]
    assert mine[1]["args"] == {"event": "1@step3:kill", "failed_after_step": 2, "seconds": 1.25}
    # before the first span, it moves the origin; outside the steps kept, it is left out
    early = failure_track.from_costs([dict(costs[0], failed_at=999.0)], -1000.0)
    moved = trace_events(events, [0.0, 0.0], ["rank 0", "rank 1"], failures=early)
    assert min(e["ts"] for e in moved if "ts" in e) == 0
    assert min(e["ts"] for e in moved if e.get("cat") == "step") == 1e6
    kept = trace_events(events, [0.0, 0.0], ["rank 0", "rank 1"], steps=1, failures=failures)
    assert not [e for e in kept if e.get("cat") == "failure"]
    # a torchft replica group outside the trace's world: a process of its own
    group = failure_track.from_costs([dict(costs[0], rank=2, rejoin_seconds=9.0)], -1000.0)
    alone = trace_events(events[:1], [0.0], ["rank 0"], failures=group)
    assert {"name": "replica group 2"} in [e["args"] for e in alone
                                           if e["name"] == "process_name"]
    assert [e["name"] for e in alone if e.get("cat") == "failure"][1] == \
        "rejoin: training with the others again"
    # a restart's: detected by a survivor, the job started again by its launcher after
    restarted = failure_track.from_costs([dict(costs[0], restart_seconds=0.9)], -1000.0)
    spans = [(e["name"], e["dur"]) for e in trace_events(
        events, [0.0, 0.0], ["rank 0", "rank 1"], failures=restarted) if e.get("ph") == "X"
        and e.get("cat") == "failure"]
    assert spans == [("recovery: to the first complete step after it", 1.25e6),
                     ("restart: the launcher started the job again", 0.9e6),
                     ("detection", 0.5e6)]


def test_the_timeline_file_holds_the_failures_whose_costs_the_result_records(tmp_path):
    import json
    import time
    from types import SimpleNamespace

    from commbench.result import record

    now = spans.now()
    events = [step_events(s, now - 3 + s, 0.01, 0.02, 0.07, 0.005) for s in range(3)]
    doc = {"schema_version": 1, "config": {}, "recovery": {"costs": [
        {"event": "1@step2:kill", "rank": 1, "failed_after_step": 1,
         "failed_at": time.time() - 1.5, "detection_seconds": 0.25,
         "recovery_seconds": 0.75}]}}
    path = tmp_path / "trace.json"
    record.write_timeline(SimpleNamespace(timeline=str(path), timeline_steps=200), doc,
                          [[e for step in events for e in step]] * 2, ["h", "h"],
                          {"seconds": [0.0, 0.0]})
    trace = json.loads(path.read_text())["traceEvents"]
    fired = next(e for e in trace if e.get("cat") == "failure" and e["ph"] == "i")
    first = next(e for e in trace if e.get("cat") == "step")
    assert fired["pid"] == 1 and fired["ts"] - first["ts"] == pytest.approx(1.5e6, abs=0.1e6)
