"""The winner map (commbench.analysis.winner_map): from runs trained to accuracy on
several networks and straggler settings, the first to the target in each cell, its lead,
"too close to call" where the runs' ranges overlap, and misses shown; through `report`."""

import copy
import io
import json
import statistics
from pathlib import Path

import pytest

from commbench.result import store
from commbench.analysis import report, winner_cells, winner_map, winner_table
from commbench.analysis.accuracy import group
from commbench.analysis.accuracy_reading import usable
from commbench.result.store import load_results
from commbench.simulate import projection_file

TARGET = Path(__file__).parent / "data" / "accuracy" / "target"


def cell_runs(directory: Path, network: str, stragglers: str, times: dict) -> None:
    """The fixture's runs (2 strategies x seeds 42, 43, 44) as if run on `network` ("":
    shared memory) with `stragglers`, each strategy's times to target as given (None:
    not reached)."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(TARGET.glob("*.json")):
        doc = copy.deepcopy(json.loads(path.read_text()))
        strategy, seed = doc["strategy"]["name"], doc["config"]["seed"]
        time = times[strategy][seed - 42]
        doc["summary"].update(reached=time is not None, time_to_target=time,
                              bytes_to_target=None if time is None else 1e6 * time)
        if network:
            doc["environment"]["emulated_network"] = {"link": network}
        doc["config"]["slow_ranks"] = stragglers or "none"
        name = f"{network or 'shm'}-{stragglers or 'none'}-{path.name}".replace(":", "x")
        (directory / name).write_text(store.to_json(doc))


def the_map(directory: Path):
    runs, notes = usable(load_results([directory])[0])
    assert not notes
    found = winner_map.maps(group(runs))
    assert len(found) == 1
    return found[0]


def test_each_cell_names_the_first_its_lead_and_says_when_it_is_too_close(tmp_path):
    cell_runs(tmp_path, "200mbit", "", {"allreduce": [30, 31, 32],
                                        "neighbor_allreduce": [20, 21, 22]})
    cell_runs(tmp_path, "", "", {"allreduce": [10, 12, 15],
                                 "neighbor_allreduce": [11, 13, 14]})
    cell_runs(tmp_path, "200mbit", "1:2", {"allreduce": [None, None, 40],
                                           "neighbor_allreduce": [None, None, None]})
    found = the_map(tmp_path)
    assert found.networks == ["200mbit", ""]  # slowest link first, shared memory last
    assert found.stragglers == ["", "1:2"]
    clear = found.cells[("", "200mbit")]
    assert clear.verdict == winner_cells.CLEAR and clear.lead == 10.0
    assert clear.text() == ("neighbor_allreduce (exponential-2, dynamic, AWC, 2 ranks/machine) "
                            "by 10.0 s over allreduce (2 ranks/machine)")
    close = found.cells[("", "")]
    assert close.verdict == winner_cells.TOO_CLOSE and close.lead == 1.0
    assert close.text().startswith("too close to call: allreduce ~ neighbor_allreduce")
    # allreduce missed twice (MLPerf's rule: invalid), neighbor_allreduce every time
    missed = found.cells[("1:2", "200mbit")]
    assert missed.verdict == winner_cells.NONE and len(missed.missed) == 2
    assert ("1:2", "") not in found.cells


def test_ranges_that_overlap_are_a_clear_lead_where_the_first_was_ahead_at_every_seed(
        tmp_path):
    # the seeds spread the times more than the strategies differ: their ranges overlap
    cell_runs(tmp_path, "200mbit", "", {"allreduce": [21, 42.4, 63],
                                        "neighbor_allreduce": [20, 40, 60]})
    cell_runs(tmp_path, "", "", {"allreduce": [21, 38, 63],
                                 "neighbor_allreduce": [20, 40, 60]})
    found = the_map(tmp_path)
    paired = found.cells[("", "200mbit")]
    assert paired.verdict == winner_cells.PAIRED
    mean, low, high, seeds = paired.paired
    assert seeds == 3 and 1.0 < low < mean < high and mean == pytest.approx(1.0533, abs=1e-4)
    assert paired.text().endswith("(paired by seed: 1.05x, 95% CI 1.04-1.07x, 3 seeds)")
    # one seed the other way round: no lead either way
    mixed = found.cells[("", "")]
    assert mixed.verdict == winner_cells.TOO_CLOSE and mixed.paired[1] < 1.0
    from commbench.plots import winner_map as chart

    assert chart.cell_text(paired, "200mbit", {e.strategy: e.strategy.split()[0]
                                               for e in paired.ranked}) == (
        "neighbor_allreduce", "1.06× †")  # the combined times: 42.4 s over 40 s
    assert "† ranges overlap, but ahead paired by seed" in chart.caption(found)


def test_no_pairing_where_the_first_missed_a_seed_the_next_reached_or_seeds_repeat(tmp_path):
    # the first ahead at two seeds but short of the target at the third, which the next
    # reached: no lead paired by seed (and too few seeds where both reached besides)
    cell_runs(tmp_path / "missed", "200mbit", "", {"allreduce": [21, 42, None],
                                                   "neighbor_allreduce": [22, 44, 66]})
    cell_runs(tmp_path / "missed", "", "", {"allreduce": [21, 42, 63],
                                            "neighbor_allreduce": [20, 40, 60]})
    missed = the_map(tmp_path / "missed").cells[("", "200mbit")]
    assert missed.ranked[0].label.startswith("allreduce") and missed.paired is None
    assert missed.verdict == winner_cells.TOO_CLOSE
    # runs that share a seed are not paired: each seed is the machine's, not the task's
    cell_runs(tmp_path / "same", "", "", {"allreduce": [21, 42.4, 63],
                                          "neighbor_allreduce": [20, 40, 60]})
    for path in (tmp_path / "same").glob("*.json"):
        doc = json.loads(path.read_text())
        doc["config"]["seed"] = 42
        path.write_text(store.to_json(doc))
    runs, _ = usable(load_results([tmp_path / "same"])[0])
    entries = [winner_map.accuracy_entry(row) for g in group(runs) for row in g.rows]
    assert len(entries) == 2 and all(e.by_seed == () for e in entries)
    # a fourth seed, which the first missed: against it only where the next reached it
    Entry, Cell = winner_cells.Entry, winner_cells.Cell
    ahead = ((1, 10.0), (2, 20.0), (3, 30.0))
    behind = ((1, 11.0), (2, 21.5), (3, 32.0))
    for missed_too, paired in ((None, True), (44.0, False)):
        cell = Cell(winner_cells.ACCURACY, [Entry("a", 20, (10, 30), None, "", ahead + (
            (4, None),)), Entry("b", 21.5, (11, 44), None, "", behind + ((4, missed_too),))],
                    [])
        assert (cell.paired is not None) == paired, missed_too


def test_report_prints_the_map_with_its_misses_and_unrun_cells(tmp_path):
    cell_runs(tmp_path, "200mbit", "", {"allreduce": [30, 31, 32],
                                        "neighbor_allreduce": [20, 21, 22]})
    cell_runs(tmp_path, "200mbit", "1:2", {"allreduce": [50, 51, 52],
                                           "neighbor_allreduce": [None, 25, 26]})
    cell_runs(tmp_path, "", "", {"allreduce": [None, None, None],
                                 "neighbor_allreduce": [None, None, None]})
    out = io.StringIO()
    assert report.report([tmp_path], out=out, err=io.StringIO()) == 0
    text = out.getvalue().split("Winner map: ")[1]
    firsts, sent = text.split("Bytes each worker of the first sent to the target")
    rows = {line.split("  ")[0]: line for line in firsts.splitlines()}
    assert "neighbor_allreduce (exponential-2, dynamic, AWC, 2 ranks/machine) by 10.0 s" in \
        rows["no straggler"]
    assert "none reached it" in rows["no straggler"]
    assert "rank 1 2x slower" in rows and "not run" in rows["rank 1 2x slower"]
    assert "by 25.0 s" in rows["rank 1 2x slower"]
    assert "shared memory" in text
    bytes_rows = {line.split("  ")[0]: line.split() for line in sent.splitlines()}
    # the first's median bytes (1e6 x its median time); none where none reached
    assert bytes_rows["no straggler"][-2:] == ["20M", "-"]


def test_plot_draws_the_map_beside_the_accuracy_charts(tmp_path):
    from commbench.analysis import plot_command

    runs = tmp_path / "runs"
    cell_runs(runs, "200mbit", "", {"allreduce": [30, 31, 32],
                                    "neighbor_allreduce": [20, 21, 22]})
    cell_runs(runs, "", "0:1.5@0.5", {"allreduce": [10, 12, 14],
                                      "neighbor_allreduce": [None, None, None]})
    out = io.StringIO()
    assert plot_command.plot([runs], tmp_path / "charts", out=out, err=io.StringIO()) == 0
    maps = [line for line in out.getvalue().splitlines() if "winner-map-" in line]
    assert len(maps) == 1 and maps[0].endswith("-n2.png") and Path(maps[0]).stat().st_size


def test_one_network_and_one_setting_make_no_map(tmp_path):
    cell_runs(tmp_path, "", "", {"allreduce": [10, 12, 14],
                                 "neighbor_allreduce": [11, 13, 15]})
    runs, _ = usable(load_results([tmp_path])[0])
    assert winner_map.maps(group(runs)) == []
    assert winner_table.render(group(runs)) == ""


def test_uneven_links_are_a_network_of_their_own_after_the_even_one_of_their_rate():
    from commbench.analysis.reading import network_of

    uneven = network_of({"emulated_network": {"link": "1gbit", "link_of": {"m3": "100mbit"}}})
    assert uneven == "1gbit (m3 at 100mbit)"
    assert network_of({"emulated_network": {"link": "1gbit", "link_of": {}}}) == "1gbit"
    assert network_of({}) == ""
    ordered = sorted(["", uneven, "1gbit", "200mbit"], key=winner_cells.network_order)
    assert ordered == ["200mbit", "1gbit", uneven, ""]


def test_a_speed_sweep_maps_the_most_images_per_second_and_calls_overlaps_too_close(tmp_path):
    from commbench.analysis.reader import analyse

    runs = Path(__file__).parent / "data" / "runs"
    for network in ("", "200mbit"):
        for path in runs.glob("*-n2-*.json"):
            doc = json.loads(path.read_text())
            if network:
                doc["environment"]["emulated_network"] = {"link": network}
                doc["summary"]["total_img_sec"]["mean"] /= 2  # the link halves every one
            (tmp_path / f"{network or 'shm'}-{path.name}").write_text(store.to_json(doc))
    groups, notes = analyse([tmp_path])
    found, = winner_map.maps(groups)
    assert found.kind is winner_cells.SPEED and found.networks == ["200mbit", ""]
    cell = found.cells[("", "")]
    # neighbor_allreduce 160.1 +- 3.7 beside its ring variant 158.6 +- 2.3: no call;
    # `none` (the compute-only reference, 212.8) is no contender
    assert [e.label for e in cell.ranked][:2] == [
        "neighbor_allreduce (exponential-2, dynamic, AWC)",
        "neighbor_allreduce (ring, static, AWC)"]
    assert cell.verdict == winner_cells.TOO_CLOSE
    assert cell.text().endswith("(1.5 img/s)")
    assert all("none" not in e.label for e in cell.ranked)
    out = io.StringIO()
    assert report.report([tmp_path], out=out, err=io.StringIO()) == 0
    assert "Most images per second over all workers" in out.getvalue()


def test_projections_at_other_links_and_stragglers_make_a_map_labelled_projected(tmp_path):
    from cli_helpers import commbench
    from commbench.analysis import plot_command
    from test_simulate import STATED

    stated = [a for a in STATED]
    stated[stated.index("--link") + 1] = "{link}"
    for link in ("10gbit", "100gbit"):
        for slow in ([], ["--slow-ranks", "1:2"]):
            args = [a.format(link=link) for a in stated]
            done = commbench("simulate", *args, "--np", "16", "--dist-optimizer",
                             "allreduce,neighbor_allreduce", *slow,
                             "-o", tmp_path / "p" / f"{link}{len(slow)}")
            assert done.returncode == 0, done.stderr
    out = io.StringIO()
    assert report.report([tmp_path / "p"], out=out, err=io.StringIO()) == 0
    text = out.getvalue().split("PROJECTED winner map: ")[1]
    assert text.startswith("PROJECTION: resnet50, batch 128 per worker")
    assert "10gbit (projected)" in text and "100gbit (projected)" in text
    assert "rank 1 2x slower" in text and "no straggler" in text
    assert "by commbench's cost model, not a measurement" in text
    charts = io.StringIO()
    assert plot_command.plot([tmp_path / "p"], tmp_path / "charts", out=charts,
                             err=io.StringIO()) == 0
    assert any("winner-map-projected-n16" in line for line in charts.getvalue().splitlines())


def test_a_projected_lead_within_the_models_own_error_is_too_close_to_call():
    Entry, Cell = winner_cells.Entry, winner_cells.Cell
    second = Entry("allreduce", 106.0, (100.0, 107.0), None)
    near = Cell(winner_cells.PROJECTED, [Entry("a", 110.0, (108.0, 112.0), None), second], [])
    far = Cell(winner_cells.PROJECTED, [Entry("a", 120.0, (118.0, 122.0), None), second], [])
    assert near.verdict == winner_cells.TOO_CLOSE  # bands apart, but 3.8% < 5%
    assert far.verdict == winner_cells.CLEAR
    measured = Cell(winner_cells.SPEED, near.ranked, [])
    assert measured.verdict == winner_cells.CLEAR  # measured: the intervals alone decide


def test_a_projection_of_the_workload_is_a_column_beside_the_measured_ones(tmp_path):
    pytest.importorskip("torch.utils.flop_counter", reason="commbench simulate needs torch >= 2.1")
    from cli_helpers import commbench
    from commbench.analysis import plot_command

    runs = tmp_path / "runs"
    cell_runs(runs, "200mbit", "", {"allreduce": [30, 31, 32],
                                    "neighbor_allreduce": [20, 21, 22]})
    cell_runs(runs, "", "", {"allreduce": [10, 12, 14], "neighbor_allreduce": [11, 13, 15]})
    for model, out in (("resnet18", "same"), ("resnet50", "other")):  # the other: no column
        done = commbench("simulate", "--img-sec", "400", "--model", model, "--batch-size",
                         "32", "--image-size", "32", "--gpus-per-machine", "1", "--link",
                         "10gbit", "--np", "2", "--dist-optimizer",
                         "allreduce,neighbor_allreduce", "-o", tmp_path / "p" / out)
        assert done.returncode == 0, done.stderr
    (projection,), _ = projection_file.usable(load_results([tmp_path / "p" / "same"])[0])
    step = {r["strategy"]: r for r in projection.doc["rows"]}
    found = winner_map.maps(group(usable(load_results([runs])[0])[0]),
                            projection_file.usable(load_results([tmp_path / "p"])[0])[0])
    (the,) = found
    assert the.networks == ["200mbit", "10gbit (projected)", ""]
    assert the.kinds == [winner_cells.ACCURACY, winner_cells.PROJECTED_TIME]
    cell = the.cells[("", "10gbit (projected)")]
    assert cell.kind is winner_cells.PROJECTED_TIME and cell.lines()[0] == "PROJECTED"
    # the fixture's median steps to the target (of the runs that record them, in either
    # cell) times the projected step
    runs_steps = {}
    for path in TARGET.glob("*.json"):
        doc = json.loads(path.read_text())
        if doc["summary"]["steps_to_target"]:
            runs_steps.setdefault(doc["strategy"]["name"], []).append(
                doc["summary"]["steps_to_target"])
    for entry in cell.ranked:
        name = entry.label.split(" ")[0]
        row = next(r for s, r in step.items() if s.split(" ")[0] == name)
        steps = statistics.median(runs_steps[name])
        assert entry.value == pytest.approx(steps * 2 * 32 / row["img_sec"])
        assert entry.interval == pytest.approx((steps * 64 / row["band"][1],
                                                steps * 64 / row["band"][0]))
    # a strategy's first steps that run otherwise (PowerSGD's, sent whole) at their own
    doc = json.loads(projection.path.read_text())
    first = next(r for r in doc["rows"] if r["strategy"] == "allreduce")
    first["first_steps"] = {"steps": 1, "img_sec": first["img_sec"] / 10}
    projection.path.write_text(json.dumps(doc))
    (again,) = winner_map.maps(group(usable(load_results([runs])[0])[0]),
                               projection_file.usable(load_results([tmp_path / "p"])[0])[0])
    slower = next(e for e in again.cells[("", "10gbit (projected)")].ranked
                  if e.label.startswith("allreduce"))
    steps = statistics.median(runs_steps["allreduce"])
    assert slower.value == pytest.approx(64 / (first["img_sec"] / 10)
                                         + (steps - 1) * 64 / first["img_sec"])
    projection.path.write_text(json.dumps(dict(doc, rows=[dict(r, first_steps=None)
                                                          for r in doc["rows"]])))
    out = io.StringIO()
    assert report.report([runs, tmp_path / "p"], out=out, err=io.StringIO()) == 0
    text = out.getvalue().split("Winner map: ")[1]
    header = next(line for line in text.splitlines() if line.startswith("stragglers"))
    assert "10gbit (projected)" in header
    first = next(line for line in text.splitlines() if line.startswith("no straggler"))
    assert f"PROJECTED {cell.ranked[0].label} by" in first
    assert "PROJECTED, in the columns so marked" in text
    charts = io.StringIO()
    assert plot_command.plot([runs, tmp_path / "p"], tmp_path / "charts", out=charts,
                             err=io.StringIO()) == 0
    assert len([line for line in charts.getvalue().splitlines()
                if "winner-map-" in line and "projected" not in line]) == 1


def chart_texts(fig) -> list:
    """What the chart's cells say, row by row: (large, small) per cell."""
    texts = [t.get_text() for t in fig.axes[0].texts]
    return list(zip(texts[::2], texts[1::2]))


def test_the_chart_gives_each_cell_the_first_its_lead_or_too_close_and_fits_a_page(tmp_path):
    from matplotlib.image import imread

    from commbench.analysis import plot_command
    from commbench.plots import winner_map as chart

    runs = tmp_path / "runs"
    cell_runs(runs, "200mbit", "", {"allreduce": [30, 31, 32],
                                    "neighbor_allreduce": [20, 21, 22]})
    cell_runs(runs, "", "", {"allreduce": [10, 12, 15], "neighbor_allreduce": [11, 13, 14]})
    cell_runs(runs, "200mbit", "1:2", {"allreduce": [None, None, 40],
                                       "neighbor_allreduce": [None, None, None]})
    fig = chart.figure(the_map(runs))
    # rows: no straggler, rank 1 2x slower; columns: 200mbit, shared memory
    assert chart_texts(fig) == [("neighbor_allreduce", "1.5×"),  # 31 s over 21 s
                                ("too close", "allreduce\n~ neighbor_allreduce"),
                                ("none reached it", ""), ("not run", "")]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["allreduce", "neighbor_allreduce (exponential-2, dynamic, AWC)"]
    out = io.StringIO()
    assert plot_command.plot([runs], tmp_path / "charts", out=out, err=io.StringIO()) == 0
    (path,) = [line for line in out.getvalue().splitlines() if "winner-map-" in line]
    assert imread(path).shape[1] <= 2000


def test_a_chart_of_many_columns_stays_under_2000_px_and_marks_projections(tmp_path):
    from matplotlib.image import imread

    from commbench.plots import scaling
    from commbench.plots import winner_map as chart

    Entry, Cell = winner_cells.Entry, winner_cells.Cell
    cells = {}
    for i, rate in enumerate(range(100, 1300, 100)):  # 12 links, the last 4 projected
        kind = winner_cells.PROJECTED_TIME if i >= 8 else winner_cells.ACCURACY
        network = f"{rate}mbit" + (winner_cells.PROJECTED_COLUMN if i >= 8 else "")
        band = (10.0, 11.0) if i >= 8 else None  # measured: single runs
        cells[("", network)] = Cell(kind, [Entry("local_sgd (H=8)", 10.5, band, None),
                                           Entry("allreduce", 21.0, band and (20, 22), None)],
                                    [])
    found = winner_cells.WinnerMap.of(winner_cells.ACCURACY, "a task; 4 workers", "task", "", 4,
                                      cells)
    fig = chart.figure(found)
    texts = chart_texts(fig)
    assert texts[0] == ("local_sgd", "2.0× *") and texts[-1] == ("local_sgd", "2.0×")
    assert "* single runs" in fig.axes[0].get_title()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[-1] == "projected by commbench's cost model, not measured"
    hatched = [p for p in fig.axes[0].patches if p.get_hatch()]
    assert len(hatched) == 4
    (path,) = scaling.save_named(fig, tmp_path, "winner-map-wide")
    assert imread(str(path)).shape[1] <= 2000


def test_short_names_keep_only_the_settings_that_tell_two_apart():
    from commbench.plots import winner_map as chart

    names = chart.short_names(["allreduce", "allreduce (powersgd:4)", "local_sgd (H=8)",
                               "neighbor_allreduce (exponential-2, dynamic, AWC)",
                               "neighbor_allreduce (ring, static, AWC)"])
    assert names == {"allreduce": "allreduce", "allreduce (powersgd:4)": "allreduce powersgd:4",
                     "local_sgd (H=8)": "local_sgd",
                     "neighbor_allreduce (exponential-2, dynamic, AWC)":
                         "neighbor_allreduce exponential-2",
                     "neighbor_allreduce (ring, static, AWC)": "neighbor_allreduce ring"}
    # one setting is not enough where a third shares it: the next one too
    assert chart.short_names(["a (x, p)", "a (x, q)", "a (y, p)"]) == {
        "a (x, p)": "a x p", "a (x, q)": "a x q", "a (y, p)": "a y"}
    assert chart.wrap_name("hierarchical_neighbor_allreduce", 18) == \
        "hierarchical_\nneighbor_allreduce"


def test_the_lead_as_a_factor_reads_the_same_way_for_times_and_rates():
    Entry, Cell = winner_cells.Entry, winner_cells.Cell
    fast, slow = Entry("a", 10.0, None, None), Entry("b", 16.0, None, None)
    assert Cell(winner_cells.ACCURACY, [fast, slow], []).ratio == 1.6  # 16 s over 10 s
    assert Cell(winner_cells.SPEED, [slow, fast], []).ratio == 1.6  # 16 img/s over 10
    assert Cell(winner_cells.SPEED, [slow], []).ratio is None


def test_a_wrapped_name_keeps_its_lead_below_all_its_lines():
    from matplotlib.figure import Figure

    from commbench.plots import winner_map as chart

    ax = Figure().subplots()
    font = 10.0
    chart._write(ax, 0, 0, ("neighbor_allreduce\nbf16", "1.04×"), font, True)
    name, lead = ax.texts
    assert name.xyann[1] - lead.xyann[1] >= 2 * 1.25 * font  # two lines of the name
