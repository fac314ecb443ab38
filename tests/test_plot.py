"""`commbench plot`: charts rendered from the committed fixture runs, checked by
file, by pixels and through the figure object."""

import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from commbench.analysis import plot_command as plot
from commbench.analysis import grouping, reader
from commbench.plots import scaling

DATA = Path(__file__).parent / "data"
RUNS, NEW, JUNK = DATA / "runs", DATA / "runs-new", DATA / "junk"


def run_plot(paths, out_dir, formats=()):
    out, err = io.StringIO(), io.StringIO()
    code = plot.plot(paths, out_dir, formats, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def legend_labels(fig):
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_plot_writes_a_named_png_per_group_and_prints_its_path(tmp_path):
    code, out, err = run_plot([RUNS, NEW, JUNK], tmp_path)
    paths = [Path(line) for line in out.splitlines()]
    assert code == 0 and len(err.splitlines()) == 5  # one warning per junk file
    names = sorted(p.name for p in paths)
    assert names == ["scaling-resnet18-bs8-32px-fp16-allreduce-cpu-gloo-new.png",
                     "scaling-resnet18-bs8-32px-fp32-cpu-gloo-new.png",
                     "scaling-resnet18-bs8-32px-fp32-cpu-gloo.png"]
    for path in paths:
        assert path.parent == tmp_path and path.stat().st_size > 20_000


def test_the_chart_is_not_blank(tmp_path):
    from matplotlib.image import imread

    code, out, _ = run_plot([RUNS], tmp_path)
    pixels = imread(out.splitlines()[0])[..., :3]
    assert pixels.shape[1] > 2 * pixels.shape[0]  # panels side by side
    ink = (pixels < 0.9).any(axis=2)
    assert 0.03 < ink.mean() < 0.5  # lines, text and axes, on a mostly white page
    colored = np.ptp(pixels, axis=2) > 0.3  # strategies are drawn in colour
    assert colored.sum() > 500


def test_legend_has_one_entry_per_strategy_plus_the_ideal_line():
    group = reader.analyse([RUNS])[0][0]
    fig = scaling.figure(group)
    labels = legend_labels(fig)
    assert labels == ["allreduce",
                      "hierarchical_neighbor_allreduce (exponential-2, dynamic, AWC, "
                      "2 ranks/machine)",
                      "neighbor_allreduce (exponential-2, dynamic, AWC)",
                      "neighbor_allreduce (ring, static, AWC)",
                      "none", "oversubscribed: more workers than cores (CPU sharing)",
                      "ideal: N × none 1-worker throughput"]
    throughput, efficiency = fig.axes[0], fig.axes[1]
    assert list(throughput.get_xticks()) == [1, 2, 4]
    assert throughput.get_xscale() == "log"
    # each point is labelled with its efficiency E(N)
    notes = [t.get_text() for t in throughput.texts]
    assert len(notes) == len(group.points) and all(n.rstrip("!").endswith("%") for n in notes)
    doubted = {p.workers for p in group.points if {"noisy", "E(N)>100%"} & set(p.flags)}
    assert any(n.endswith("!") for n in notes) == bool(doubted)
    # an oversubscribed point is drawn a second time, hollow
    hollow = [line for line in throughput.get_lines() if line.get_markerfacecolor() == "white"]
    assert hollow and all(4 in line.get_xdata() for line in hollow if len(line.get_xdata()))
    assert efficiency.get_ylabel() == "scaling efficiency (%)"


def test_the_title_says_how_many_points_are_not_to_be_trusted_and_why():
    group = reader.analyse([RUNS])[0][0]
    doubtful = [p for p in group.points if p.flags]
    title = scaling.figure(group).get_suptitle()
    first, second = title.split("\n")
    assert first == group.key.title() and "oversubscribed" in second
    assert second.startswith(f"{len(doubtful)} of {len(group.points)} points not to be "
                             "trusted (") and second.endswith("): see `commbench report`")
    trusted = copy.deepcopy(group)
    trusted.points = [p for p in trusted.points if not p.flags]
    assert trusted.points and scaling.figure(trusted).get_suptitle() == group.key.title()


def test_consensus_panel_has_a_line_per_decentralized_configuration():
    runs = [r for r in reader.load_runs([RUNS])[0] if r.series.strategy == "neighbor_allreduce"]
    group = grouping.group_runs(runs)[0]
    fig = scaling.figure(group)
    assert legend_labels(fig) == ["neighbor_allreduce (exponential-2, dynamic, AWC)",
                                  "neighbor_allreduce (ring, static, AWC)",
                                  "oversubscribed: more workers than cores (CPU sharing)",
                                  "ideal: N × in-job compute-only rate"]
    consensus = fig.axes[2]
    assert consensus.get_xlabel() == "iteration" and consensus.get_yscale() == "log"
    assert len(consensus.get_lines()) == 4  # two topologies at N = 2 and 4
    assert [t.get_text() for t in consensus.get_legend().get_texts()] == ["N=4", "N=2"]


def test_without_consensus_there_are_two_panels_and_without_one_worker_the_in_job_ideal():
    runs = [r for r in reader.load_runs([RUNS])[0]
            if r.series.strategy == "allreduce" and r.workers > 1]
    fig = scaling.figure(grouping.group_runs(runs)[0])
    assert len(fig.axes) == 2
    assert legend_labels(fig) == ["allreduce",
                                  "oversubscribed: more workers than cores (CPU sharing)",
                                  "ideal: N × in-job compute-only rate"]
    assert "E*" in fig.axes[1].get_title()


def test_repeats_are_one_point_not_two():
    group = reader.analyse([RUNS])[0][0]
    fig = scaling.figure(group)
    line = fig.axes[0].containers[0].lines[0]  # allreduce's errorbar line
    assert list(line.get_xdata()) == [1, 2, 4]


def test_svg_beside_png(tmp_path):
    code, out, _ = run_plot([RUNS], tmp_path, formats=["svg"])
    assert code == 0
    assert sorted(Path(p).suffix for p in out.splitlines()) == [".png", ".svg"]
    assert "<svg" in Path(out.splitlines()[1]).read_text()[:1000]


def test_groups_that_differ_only_in_hardware_get_different_names(tmp_path):
    doc = json.loads(sorted(RUNS.glob("*-allreduce-n1-*.json"))[0].read_text())
    other = copy.deepcopy(doc)
    other["environment"]["cpu"] = "Other CPU 9000"
    for i, d in enumerate([doc, other]):
        (tmp_path / f"{i}.json").write_text(json.dumps(d))
    names = plot.chart_names(reader.analyse([tmp_path])[0])
    assert len(set(names)) == 2 and any(n.endswith("-Other_CPU_9000") for n in names)


def test_nothing_usable_exits_1(tmp_path):
    code, out, err = run_plot([JUNK], tmp_path / "charts")
    assert code == 1 and out == ""
    assert "no usable commbench run results" in err.splitlines()[-1]
    assert not (tmp_path / "charts").exists()


@pytest.mark.job
@pytest.mark.timeout(120)
def test_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "commbench", "plot", str(RUNS), str(JUNK),
                           "-o", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_file() and len(proc.stderr.splitlines()) == 5


def test_a_wide_range_of_workers_is_drawn_log_log(tmp_path):
    doc = json.loads(sorted(RUNS.glob("*-allreduce-n4-*.json"))[0].read_text())
    for n in (1, 16):
        other = copy.deepcopy(doc)
        other["summary"]["workers"] = n
        other["summary"]["total_img_sec"]["mean"] *= n / 4
        (tmp_path / f"n{n}.json").write_text(json.dumps(other))
    paths = [tmp_path, sorted(RUNS.glob("*-allreduce-n4-*"))[0]]
    fig = scaling.figure(reader.analyse(paths)[0][0])
    assert fig.axes[0].get_yscale() == "log"
    assert list(fig.axes[0].get_xticks()) == [1, 4, 16]
    scaling.save(fig, [tmp_path / "wide.png"])
    assert (tmp_path / "wide.png").stat().st_size > 20_000


def test_two_charts_never_get_one_name():
    from commbench.analysis.plot_command import unique_names

    assert unique_names(["a", "a", "a", "b"], ["x", "y", "x", ""]) == ["a-x", "a-y", "a-x-2", "b"]
    assert unique_names(["projected-n4", "projected-n4"], ["", ""]) == ["projected-n4",
                                                                      "projected-n4-2"]
    assert "/" not in unique_names(["../up"], ["h"])[0]
