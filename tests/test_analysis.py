"""commbench.analysis (runs, reading, grouping): loading, grouping and combining the
committed fixture runs
(tests/data, made by tests/data/make_fixtures.sh from real tiny runs)."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from commbench.result import metrics
from commbench.analysis import grouping, reader, reading, runs

DATA = Path(__file__).parent / "data"
RUNS, NEW, JUNK = DATA / "runs", DATA / "runs-new", DATA / "junk"


def fixture_doc(pattern: str) -> dict:
    path = sorted(RUNS.glob(pattern))[0]
    return json.loads(path.read_text())


def write(directory: Path, name: str, doc: dict) -> Path:
    path = directory / name
    path.write_text(json.dumps(doc))
    return path


def test_every_junk_file_is_skipped_with_one_note_and_the_runs_still_load():
    runs, notes = reader.load_runs([RUNS, JUNK])
    assert len(runs) == len(list(RUNS.glob("*.json")))
    assert len(notes) == len(list(JUNK.iterdir())) == 5
    text = "\n".join(notes)
    for name, reason in [("corrupt.json", "not valid JSON"), ("empty.json", "not valid JSON"),
                         ("package.json", "not a commbench result"),
                         ("future-schema.json", "newer than this commbench"),
                         ("microbenchmark.json", "'microbenchmark' result")]:
        assert any(name in n and reason in n for n in notes), text


def test_a_malformed_run_is_skipped_not_a_crash(tmp_path):
    doc = fixture_doc("*-allreduce-n1-*.json")
    del doc["summary"]["total_img_sec"]
    write(tmp_path, "broken.json", doc)
    runs, notes = reader.load_runs([tmp_path])
    assert runs == [] and len(notes) == 1 and "malformed" in notes[0]


def test_fixture_runs_form_one_group_each_strategy_against_its_own_one_worker_run():
    groups, _ = reader.analyse([RUNS])
    assert len(groups) == 1
    group = groups[0]
    assert group.key.model == "resnet18" and group.key.batch_size == 8
    assert group.key.precision == "fp32" and group.key.backend == "gloo"
    singles = {p.series.strategy: p.total for p in group.points if p.workers == 1}
    assert set(singles) == {"allreduce", "none"}
    for p in group.points:  # E(N) like with like: the same strategy's Total(1), else none's
        total1 = singles.get(p.series.strategy, singles["none"])
        assert p.efficiency == pytest.approx(p.total / (p.workers * total1))
        assert group.baselines[p.series].total == pytest.approx(total1)
    assert group.baseline.source.strategy == "none"  # the chart's ideal line
    assert group.workers == [1, 2, 4]
    assert group.series[-1].strategy == "none"  # the reference is listed last


def test_repeats_are_combined_with_a_ci_over_the_runs_means():
    group = reader.analyse([RUNS])[0][0]
    repeated = [p for p in group.points if len(p.runs) > 1]
    assert len(repeated) == 1
    p = repeated[0]
    means = [r.total for r in p.runs]
    assert p.total == pytest.approx(np.mean(means))
    assert p.ci == pytest.approx(metrics.ci95_halfwidth(means)) and p.ci_over == "runs"
    assert len(p.totals) == sum(len(r.totals) for r in p.runs)
    single = next(q for q in group.points if len(q.runs) == 1)
    assert single.ci == single.runs[0].total_ci and single.ci_over == "iterations"


def test_totals_are_the_per_iteration_sum_over_ranks():
    run = reader.load_runs([RUNS])[0][0]
    config, samples = run.doc["config"], run.doc["samples"]
    images = config["batch_size"] * config["num_batches_per_iter"]
    expected = [sum(images / rank[i] for rank in samples["iteration_seconds"])
                for i in range(config["num_iters"])]
    assert run.totals == pytest.approx(expected)
    assert np.mean(run.totals) == pytest.approx(run.total)


def test_hardware_and_tag_split_groups_but_not_compare_matches():
    base = reader.load_runs([RUNS])[0]
    new = reader.load_runs([NEW])[0]
    assert {r.key.tag for r in new} == {"new"}
    groups = grouping.group_runs(base + new)
    assert len({g.key for g in groups}) == len(groups) >= 2
    assert {r.match_key for r in base} & {r.match_key for r in new}


def test_series_carry_the_topology_settings_a_plugin_records():
    doc = fixture_doc("*-allreduce-n2-*.json")
    assert reading.series_of(doc) == runs.Series("allreduce")
    doc["strategy"] = {"name": "neighbor_allreduce", "decentralized": True,
                       "topology": "exponential-2", "dynamic": True, "style": "atc"}
    series = reading.series_of(doc)
    assert series.label() == "neighbor_allreduce (exponential-2, dynamic, ATC)"
    # `none` records no topology, whatever --topology said
    assert reading.series_of(fixture_doc("*-none-n2-*.json")).settings() == ""


def test_without_a_one_worker_run_the_ideal_is_the_in_job_compute_only_rate():
    runs = [r for r in reader.load_runs([RUNS])[0] if r.workers > 1]
    group = grouping.group_runs(runs)[0]
    assert group.baseline is None
    assert all(p.efficiency is None for p in group.points)
    ideal, source = group.ideal()
    assert "compute-only" in source
    rates = [r.compute_only for r in runs if r.workers == 4 and r.compute_only]
    assert ideal[4] == pytest.approx(4 * np.mean(rates))


def test_repeated_consensus_curves_are_averaged_per_iteration(tmp_path):
    doc = fixture_doc("*-none-n2-*.json")
    other = copy.deepcopy(doc)
    other["samples"]["consensus_distance"] = [2 * c for c in doc["samples"]["consensus_distance"]]
    runs = [reading.read_run(write(tmp_path, f"{i}.json", d), d)
            for i, d in enumerate([doc, other])]
    point = grouping.combine(runs)
    assert point.consensus == pytest.approx(1.5 * np.array(doc["samples"]["consensus_distance"]))


@pytest.mark.job
def test_analysis_commands_import_neither_torch_nor_matplotlib():
    code = ("import sys, commbench.analysis.report, commbench.analysis.compare, "
            "commbench.analysis.plot_command, "
            "commbench.plots.scaling; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_runs_with_options_that_change_what_runs_are_a_series_of_their_own():
    def doc(**facts):
        return {"config": {"dist_optimizer": facts.get("name", "allreduce")},
                "strategy": {"name": "allreduce", **facts}, "environment": {}}

    plain = reading.series_of(doc(broadcast_buffers=True))
    own = reading.series_of(doc(broadcast_buffers=False))
    assert plain != own and own.label() == "allreduce (own BatchNorm statistics)"
    assert reading.series_of(doc()) == plain  # files from before the option pool with it
    adasum = reading.series_of(doc(name="horovod", op="adasum", hierarchical_allreduce=True))
    assert adasum.variant == "Adasum, hierarchical allreduce"
