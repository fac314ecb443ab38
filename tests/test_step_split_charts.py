"""Where a step's time goes, as `report` and `plot` show it: the split table and chart
of a group whose runs recorded it, none for runs that did not (golden fixtures), and a
`--timeline` trace drawn as a picture."""

import io
import json
import shutil
from pathlib import Path

from commbench.timing import trace_file
from commbench.analysis import plot_command as plot
from commbench.analysis import report
from test_spans import step_events

DATA = Path(__file__).parent / "data"
PARTS = {"step": 0.2, "compute": 0.15, "overlapped": 0.03, "exposed": 0.03, "waiting": 0.015,
         "other": 0.005}


def runs_with_split(tmp_path):
    """The runs-new fixtures, the 2-worker allreduce ones with a split as runs record it."""
    runs = tmp_path / "runs"
    shutil.copytree(DATA / "runs-new", runs)
    for path in runs.glob("*-allreduce-n2-*.json"):
        doc = json.loads(path.read_text())
        doc["summary"]["step_split"] = {k: {"mean": v, "median": v, "p10": v, "p90": v}
                                        for k, v in PARTS.items()}
        doc["summary"]["wire"] = {"bytes_per_step": 3 * 2 ** 20, "messages_per_step": 6,
                                  "bytes_per_image": 3 * 2 ** 20 / 32,
                                  "communicating_steps": 1.0,
                                  "bytes_per_communicating_step": 3 * 2 ** 20}
        path.write_text(json.dumps(doc))
    return runs


def test_report_adds_the_split_table_where_runs_recorded_it(tmp_path):
    out = io.StringIO()
    assert report.report([runs_with_split(tmp_path)], out=out, err=io.StringIO()) == 0
    tables = out.getvalue().split("Where a step's time goes")[1:]
    assert tables
    rows = [line.split() for table in tables for line in table.splitlines()
            if line.startswith("allreduce")]
    # codec and injected: parts these runs' split was written without
    assert ["allreduce", "-", "2", "200.0", "150.0", "-", "30.0", "15.0", "-", "5.0",
            "30.0", "3M"] in rows
    assert ["allreduce", "-", "4"] + ["-"] * 9 in rows  # recorded none
    as_json = io.StringIO()
    report.report([runs_with_split(tmp_path / "again")], fmt="json", out=as_json)
    rows = [r for g in json.loads(as_json.getvalue())["groups"] for r in g["rows"]]
    assert {r["workers"]: r["step_split"] is not None for r in rows
            if r["strategy"] == "allreduce"} == {1: False, 2: True, 4: False}
    assert {r["workers"]: r["bytes_per_step"] for r in rows
            if r["strategy"] == "allreduce"} == {1: None, 2: 3 * 2 ** 20, 4: None}


def test_no_split_table_for_runs_without_one():
    out = io.StringIO()
    report.report([DATA / "runs"], out=out, err=io.StringIO())
    assert "Where a step's time goes" not in out.getvalue()


def test_plot_draws_the_split_beside_the_scaling_chart_and_a_timeline(tmp_path):
    trace = tmp_path / "trace.json"
    events = [e for s in range(5) for e in step_events(s, s, 0.01, 0.02, 0.07, 0.005)]
    trace_file.write_trace(str(trace), trace_file.trace_events(
        [events, events], [0.0, 0.0], ["rank 0", "rank 1"]), {"commbench": 1})
    out = io.StringIO()
    code = plot.plot([runs_with_split(tmp_path), trace], tmp_path / "charts", out=out,
                     err=io.StringIO())
    names = sorted(Path(line).name for line in out.getvalue().splitlines())
    assert code == 0
    assert "split-resnet18-bs8-32px-fp32-cpu-gloo-new.png" in names
    assert "timeline-trace.png" in names
    assert all((tmp_path / "charts" / n).stat().st_size > 10_000 for n in names)
    only_trace = io.StringIO()
    assert plot.plot([trace], tmp_path / "alone", out=only_trace) == 0
    assert only_trace.getvalue().strip().endswith("timeline-trace.png")


def test_the_timeline_picture_marks_a_failure_among_its_steps(tmp_path):
    from commbench.plots import timeline
    from commbench.timing import failure_track

    events = [e for s in range(5) for e in step_events(s, s, 0.01, 0.02, 0.07, 0.005)]
    cost = {"event": "1@step4:kill", "rank": 1, "failed_after_step": 3, "failed_at": 13.05,
            "detection_seconds": 0.5, "recovery_seconds": 1.5}
    trace = tmp_path / "trace.json"
    trace_file.write_trace(str(trace), trace_file.trace_events(
        [events, events], [0.0, 0.0], ["rank 0", "rank 1"],
        failures=failure_track.from_costs([cost], -10.0)), {"commbench": 1})
    fig = timeline.figure(json.loads(trace.read_text()))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["failure 1@step4:kill"]
    assert [line.get_linestyle() for line in ax.get_lines()].count("--") == 1
    # its spans are not drawn as a rank's compute
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "rank 0 compute", "rank 0 communication", "rank 1 compute", "rank 1 communication"]
    out = io.StringIO()
    assert plot.plot([trace], tmp_path / "charts", out=out) == 0
