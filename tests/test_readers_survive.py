"""`report`, `plot` and `compare` beside one bad result file: the file is skipped with
one warning line that names it and the field, and every good file is still used; a
diverged run (NaN losses, valid img/sec) is shown as diverged, and machine-readable
output stays strict JSON. Bad files are fixture results mutated in tmp_path."""

import copy
import io
import json
import math
import shutil
from pathlib import Path

import pytest

from commbench.result import store
from analysis_helpers import run_compare, run_report
from commbench.analysis import plot_command as plot
from commbench.analysis import reader, reading, validate
from commbench.analysis.comparison import Comparison
from commbench.microbench import results as microbench_results
from commbench.simulate import projection_file

DATA = Path(__file__).parent / "data"
RUNS, TARGET = DATA / "runs", DATA / "accuracy" / "target"
GOOD = sorted(RUNS.glob("*-allreduce-n[124]-*.json"))[:3]  # N = 1, 2, 4


def fixture_doc(pattern: str, directory: Path = RUNS) -> dict:
    return store.read_result(next(directory.glob(pattern)))


def good_dir(tmp_path: Path, name: str = "runs") -> Path:
    target = tmp_path / name
    target.mkdir()
    for path in GOOD:
        shutil.copy(path, target)
    return target


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def setting(path: str, value):
    def mutate(doc):
        *parents, last = path.split(".")
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return doc
    return mutate


DELETE = object()

# (what is wrong, how, the field the warning names); written through store.to_json,
# so non-finite numbers are the strings a result file holds
BAD_RUNS = [
    ("workers 0", setting("summary.workers", 0), "summary.workers"),
    ("negative img/sec", setting("summary.total_img_sec.mean", -5.0),
     "summary.total_img_sec.mean"),
    ("NaN img/sec", setting("summary.total_img_sec.mean", math.nan),
     "summary.total_img_sec.mean"),
    ("infinite img/sec", setting("summary.total_img_sec.mean", math.inf),
     "summary.total_img_sec.mean"),
    ("NaN iteration time", setting("samples.iteration_seconds.0.1", math.nan),
     "samples.iteration_seconds[0][1]"),
    ("iteration time too short to be a clock's", setting("samples.iteration_seconds.0.1",
                                                         1e-320),
     "samples.iteration_seconds[0][1]"),
    ("negative latency", setting("summary.latency_seconds_per_batch.p50", -1.0),
     "summary.latency_seconds_per_batch.p50"),
    ("workers as text", setting("summary.workers", "2"), "summary.workers"),
    ("batch size as a number with a point", setting("config.batch_size", 8.5),
     "config.batch_size"),
    ("batch size 0", setting("config.batch_size", 0), "config.batch_size"),
    ("latency a list", setting("summary.latency_seconds_per_batch", [1, 2]),
     "summary.latency_seconds_per_batch"),
    ("strategy a list", setting("strategy", ["allreduce"]), "strategy"),
    ("efficiency NaN", setting("summary.efficiency_in_job", math.nan),
     "summary.efficiency_in_job"),
    ("step split without its parts", setting("summary.step_split", {"step": {"mean": 0.1}}),
     "summary.step_split.compute"),
    ("img/sec missing", setting("summary.total_img_sec", DELETE), "summary.total_img_sec"),
    ("model missing", setting("config.model", DELETE), "config.model"),
    ("slow ranks garbled", setting("config.slow_ranks", "1:0.5"), "config.slow_ranks"),
    ("schema_version missing", setting("schema_version", DELETE), "schema_version"),
    ("schema_version text", setting("schema_version", "1"), "schema_version"),
    ("schema_version true", setting("schema_version", True), "schema_version"),
]


def bad_run(directory: Path, mutate, name: str = "bad.json") -> Path:
    doc = mutate(copy.deepcopy(fixture_doc("*-allreduce-n2-9d4*.json")))
    path = directory / name
    path.write_text(store.to_json(doc))
    return path


def assert_one_warning(err: str, path: Path, field: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert f"skipping {path}" in lines[0] and field in lines[0], lines[0]


@pytest.mark.parametrize("what, mutate, field", BAD_RUNS, ids=[b[0] for b in BAD_RUNS])
def test_report_skips_a_bad_run_with_one_line_and_reports_the_rest(tmp_path, what, mutate,
                                                                   field):
    _, alone, _ = run_report([good_dir(tmp_path, "alone")])
    runs = good_dir(tmp_path)
    path = bad_run(runs, mutate)
    code, out, err = run_report([runs])
    assert code == 0 and out == alone
    assert_one_warning(err, path, field)


def test_bare_nan_and_truncated_json_are_skipped_too(tmp_path):
    _, alone, _ = run_report([good_dir(tmp_path, "alone")])
    runs = good_dir(tmp_path)
    doc = fixture_doc("*-allreduce-n2-9d4*.json")
    doc["summary"]["total_img_sec"]["mean"] = math.nan
    bare = runs / "bare-nan.json"
    bare.write_text(json.dumps(doc))  # NaN as Python writes it, not as commbench does
    truncated = runs / "truncated.json"
    truncated.write_text(GOOD[0].read_text()[:500])
    code, out, err = run_report([runs])
    assert code == 0 and out == alone
    lines = sorted(err.splitlines())
    assert len(lines) == 2
    assert str(bare) in lines[0] and "summary.total_img_sec.mean is NaN" in lines[0]
    assert str(truncated) in lines[1] and "not valid JSON" in lines[1]


def test_plot_draws_the_good_runs_beside_every_kind_of_bad_file(tmp_path):
    runs = good_dir(tmp_path)
    diverged_run(runs)  # drawn: its img/sec stand, its consensus distance ends in inf
    bad = [bad_run(runs, mutate, f"bad-{i}.json") for i, (_, mutate, _) in enumerate(BAD_RUNS)]
    out, err = io.StringIO(), io.StringIO()
    code = plot.plot([runs], tmp_path / "charts", out=out, err=err)
    charts = [Path(line) for line in out.getvalue().splitlines()]
    assert code == 0 and [p.name for p in charts] == ["scaling-resnet18-bs8-32px-fp32-cpu-gloo.png"]
    assert charts[0].stat().st_size > 0
    lines = err.getvalue().splitlines()
    assert len(lines) == len(bad)
    for path, (_, _, field) in zip(bad, BAD_RUNS):
        assert sum(str(path) + ":" in line and field in line for line in lines) == 1


def test_compare_skips_a_bad_run_and_compares_the_rest(tmp_path):
    base, new = good_dir(tmp_path, "base"), good_dir(tmp_path, "new")
    path = bad_run(new, setting("summary.workers", 0))
    code, out, err = run_compare(base, new, fmt="json")
    assert code == 0 and len(strict_json(out)["pairs"]) == 3
    assert_one_warning(err, path, "summary.workers")


# ---------------------------------------------------------------------------------------
# a diverged run: recorded, reported, never a bare NaN


def diverged_run(directory: Path) -> Path:
    doc = fixture_doc("*-neighbor_allreduce-exponential-2-n2-*.json")
    doc["summary"].update(diverged={"step": 7, "rank": 1}, final_loss=math.nan,
                          final_consensus_distance=math.nan)
    doc["samples"]["loss"] = [[math.nan] * len(rank) for rank in doc["samples"]["loss"]]
    doc["samples"]["consensus_distance"][-1] = math.inf
    path = directory / "diverged.json"
    path.write_text(store.to_json(doc))
    return path


def test_a_diverged_run_is_reported_with_its_img_sec_and_where_it_diverged(tmp_path):
    runs = good_dir(tmp_path)
    path = diverged_run(runs)
    code, out, err = run_report([runs])
    assert code == 0 and err == ""
    row = next(line for line in out.splitlines() if line.startswith("neighbor_allreduce"))
    assert "nan" in row.split() and row.endswith("diverged")
    assert "Diverged at step 7 (first seen on rank 1): neighbor_allreduce" in out
    assert str(path) in out and "diverged: the training loss became NaN" in out


def test_report_json_stays_strict_with_a_diverged_run(tmp_path):
    runs = good_dir(tmp_path)
    path = diverged_run(runs)
    code, out, _ = run_report([runs], "json")
    rows = [r for g in strict_json(out)["groups"] for r in g["rows"]]
    row = next(r for r in rows if r["strategy"] == "neighbor_allreduce")
    assert code == 0 and row["final_consensus_distance"] == "NaN"
    assert row["total_img_sec"] > 0 and "diverged" in row["flags"].split()
    assert row["diverged"] == [{"step": 7, "rank": 1, "file": str(path)}]


def test_a_diverged_run_keeps_the_consensus_axis_logarithmic_and_is_labelled(tmp_path):
    from commbench.plots import scaling

    runs = tmp_path / "runs"
    shutil.copytree(RUNS, runs)
    diverged_run(runs)
    groups, notes = reader.analyse([runs])
    (group,) = [g for g in groups if any(len(p.consensus) and p.workers > 1 for p in g.points)]
    fig = scaling.figure(group)
    assert notes == [] and fig.axes[2].get_yscale() == "log"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    marked = [label for label in labels if label.endswith(" (diverged)")]
    assert len(marked) == 1 and marked[0].startswith("neighbor_allreduce (exponential-2,")
    assert "allreduce" in labels  # the others as they were


def test_compare_says_which_arm_diverged(tmp_path):
    base, new = good_dir(tmp_path, "base"), good_dir(tmp_path, "new")
    shutil.copy(next(RUNS.glob("*-neighbor_allreduce-exponential-2-n2-*.json")), base)
    diverged_run(new)
    code, out, err = run_compare(base, new, fmt="json")
    results = {(p["strategy"], p["workers"]): p["result"] for p in strict_json(out)["pairs"]}
    assert code == 0 and err == ""
    assert results[("neighbor_allreduce", 2)].endswith(" (loss diverged in NEW)")
    assert not any("diverged" in r for k, r in results.items() if k[0] == "allreduce")
    code, out, _ = run_compare(new, new)
    row = next(line for line in out.splitlines() if line.startswith("neighbor_allreduce"))
    assert row.endswith("(loss diverged in BASE/NEW)"), row


def test_compare_never_calls_a_nan_difference_not_significant(tmp_path):
    base, new = good_dir(tmp_path, "base"), good_dir(tmp_path, "new")
    (new / GOOD[1].name).unlink()  # the NaN run is NEW's only one at N=2
    path = bad_run(new, setting("summary.total_img_sec.mean", math.nan))
    code, out, err = run_compare(base, new)
    n2 = [line for line in out.splitlines() if line.startswith("allreduce  -         2")]
    assert code == 0 and n2 == [] and "Only in BASE" in out and "N=2: 108.1 img/sec" in out
    assert_one_warning(err, path, "summary.total_img_sec.mean")
    # and a run that reaches the comparison with a non-finite number (read without
    # its checks) is called incomparable, never "not significant"
    runs = [reading.read_run(p, store.read_result(p)) for p in GOOD]
    broken = reading.read_run(path, store.read_result(path))
    same = [r for r in runs if r.workers == broken.workers][0]
    pair = Comparison([same], [broken], 0.05, 0.05).pairs[0]
    assert pair["result"] == "n/a: cannot compare (NEW's img/sec is nan)"
    strict_json(Comparison([same], [broken], 0.05, 0.05).json())


# ---------------------------------------------------------------------------------------
# runs trained to accuracy


def accuracy_dir(tmp_path: Path) -> Path:
    target = tmp_path / "trained"
    shutil.copytree(TARGET, target)
    return target


def mutated_accuracy(directory: Path, mutate, name: str) -> Path:
    doc = store.read_result(sorted(TARGET.glob("*-allreduce-*.json"))[0])
    path = directory / name
    path.write_text(store.to_json(mutate(copy.deepcopy(doc))))
    return path


BAD_ACCURACY = [
    ("accuracy above 1", setting("curve.0.accuracy", 1.5), "curve[0].accuracy"),
    ("world size 0", setting("environment.world_size", 0), "environment.world_size"),
    ("best accuracy NaN", setting("summary.best_accuracy", math.nan), "summary.best_accuracy"),
    ("img/sec -inf", setting("summary.img_sec", -math.inf), "summary.img_sec"),
    ("training seconds text", setting("curve.1.training_seconds", "3"),
     "curve[1].training_seconds"),
    ("curve missing", setting("curve", DELETE), "curve"),
    ("slow ranks a number", setting("config.slow_ranks", 2), "config.slow_ranks"),
]


@pytest.mark.parametrize("what, mutate, field", BAD_ACCURACY, ids=[b[0] for b in BAD_ACCURACY])
def test_a_bad_accuracy_result_is_skipped_and_the_rest_reported(tmp_path, what, mutate, field):
    _, alone, _ = run_report([TARGET])
    trained = accuracy_dir(tmp_path)
    path = mutated_accuracy(trained, mutate, "bad.json")
    code, out, err = run_report([trained])
    assert code == 0 and out == alone
    assert_one_warning(err, path, field)
    assert "incomplete or malformed accuracy result" in err


def diverged_accuracy(doc: dict) -> dict:
    """The run as it would have stopped: diverged at step 5, at the next evaluation."""
    s = doc["summary"]
    s.update(reached=False, stopped_by="diverged", diverged={"step": 5, "rank": 0},
             time_to_target=None, wall_time_to_target=None, steps_to_target=None,
             epochs_to_target=None, samples_to_target=None)
    doc["curve"] = doc["curve"][:3]
    for point in doc["curve"][2:]:
        point.update(loss=math.nan, consensus_distance=math.nan)
    s["best_accuracy"] = max(p["accuracy"] for p in doc["curve"])
    return doc


def test_a_diverged_accuracy_run_is_not_reached_diverged(tmp_path):
    trained = accuracy_dir(tmp_path)
    path = mutated_accuracy(trained, diverged_accuracy, "diverged.json")
    code, out, err = run_report([trained])
    assert code == 0 and err == ""
    assert "allreduce, N=2, seed 42: not reached: diverged at step 5 (first seen on rank 0)" \
        in out and str(path) in out
    code, text, _ = run_report([trained], "json")
    details = [d for g in strict_json(text)["accuracy_groups"] for r in g["rows"]
               for d in r["runs_detail"] if d["file"] == str(path)]
    assert details[0]["stopped_by"] == "diverged" and details[0]["reached"] is False


def test_the_accuracy_table_flags_a_diverged_run_as_the_speed_table_does(tmp_path):
    trained = accuracy_dir(tmp_path)
    path = mutated_accuracy(trained, diverged_accuracy, "diverged.json")
    code, text, _ = run_report([trained], "json")
    flags = {str(path) in r["files"]: r["flags"].split()
             for g in strict_json(text)["accuracy_groups"] for r in g["rows"]}
    assert code == 0 and "diverged" in flags[True] and "diverged" not in flags[False]
    _, out, _ = run_report([trained])
    row = next(line for line in out.splitlines() if line.startswith("allreduce")
               and line.split()[2] == "2")
    assert row.endswith("diverged")


def test_compare_of_accuracy_with_a_diverged_run_is_strict_json(tmp_path):
    trained = accuracy_dir(tmp_path)
    mutated_accuracy(trained, diverged_accuracy, "diverged.json")
    code, out, err = run_compare(TARGET, trained, fmt="json")
    assert code == 0 and err == "" and strict_json(out)["accuracy"]["pairs"]


# ---------------------------------------------------------------------------------------
# microbench and projection files


def microbench_doc(seconds: float) -> dict:
    doc = store.new_document(microbench_results.KIND)
    doc.update(config={"topology": "ring"}, environment={"backend": "gloo", "device": "cpu"},
               summary={"world_size": 2, "sizes": [1024], "ops": ["allreduce"], "wrong": 0},
               rows=[{"op": "allreduce", "impl": "commbench", "commbench": True,
                      "transport": "gloo", "bytes": 1024, "count": 256,
                      "seconds": [[seconds]] * 2, "bytes_sent": 1024.0,
                      "bytes_received": 1024.0, "wrong": 0,
                      "summary": {"time": {"mean": seconds, "p50": seconds, "p99": seconds},
                                  "algbw": 1024 / seconds, "busbw": 1024 / seconds}}])
    return doc


def read_kind(kind, path):
    """The one reader, asked for one kind: what it read, and its notes."""
    read_in, notes = reader.read([path], {kind: reader.kinds()[kind]})
    return read_in[kind], notes


def test_a_microbench_file_with_a_nan_time_is_skipped_beside_a_good_one(tmp_path):
    (tmp_path / "good.json").write_text(store.to_json(microbench_doc(1e-4)))
    (tmp_path / "bad.json").write_text(store.to_json(microbench_doc(math.nan)))
    found, notes = read_kind("microbench", tmp_path)
    assert [r.path.name for r in found] == ["good.json"]
    assert len(notes) == 1 and "bad.json" in notes[0]
    assert "rows[0].summary.time.mean is NaN, not a finite number" in notes[0]
    code, out, err = run_report([tmp_path], "json")
    assert code == 0 and len(strict_json(out)["microbench"]) == 1 and len(err.splitlines()) == 1


BAD_MICROBENCH = [
    ("hostnames as lists", setting("environment.hostnames", [["a"], ["b"]]),
     "environment.hostnames[0]"),
    ("more machines than ranks", setting("environment.hostnames", ["a", "b", "c"]),
     "environment.hostnames"),
    ("topology a number", setting("config.topology", 5), "config.topology"),
]


@pytest.mark.parametrize("what, mutate, field", BAD_MICROBENCH,
                         ids=[b[0] for b in BAD_MICROBENCH])
def test_a_bad_microbench_file_is_skipped_naming_the_field(tmp_path, what, mutate, field):
    (tmp_path / "good.json").write_text(store.to_json(microbench_doc(1e-4)))
    path = tmp_path / "bad.json"
    path.write_text(store.to_json(mutate(microbench_doc(1e-4))))
    found, notes = read_kind("microbench", tmp_path)
    assert [r.path.name for r in found] == ["good.json"]
    assert len(notes) == 1 and f"skipping {path}: " in notes[0] and field in notes[0]


def test_a_microbench_reader_that_fails_on_a_file_skips_it_like_the_others(tmp_path):
    (tmp_path / "good.json").write_text(store.to_json(microbench_doc(1e-4)))
    found, _ = store.load_results([tmp_path])
    kept, notes = microbench_results.usable(found, lambda doc: doc["config"]["missing"])
    assert kept == [] and len(notes) == 1 and "KeyError: 'missing'" in notes[0]


def projection_doc(img_sec) -> dict:
    doc = store.new_document(projection_file.KIND)
    doc.update(title="PROJECTION: resnet18", notes=[], summary={}, config={},
               rows=[{"strategy": "allreduce", "workers": 2, "machines": 1, "img_sec": img_sec,
                      "band": [90.0, 110.0], "efficiency": 0.9,
                      "step": {"compute": 0.1, "exposed": 0.01, "coordination": 0.0,
                               "overlapped": 0.0, "straggler_wait": 0.0,
                               "allreduce": "ring"},
                      "img_sec_with_stragglers": None, "basis": "stated",
                      "measured": None, "measured_ci": None}])
    return doc


def test_a_projection_with_an_infinite_img_sec_is_skipped(tmp_path):
    (tmp_path / "good.json").write_text(store.to_json(projection_doc(100.0)))
    (tmp_path / "bad.json").write_text(store.to_json(projection_doc(math.inf)))
    found, notes = read_kind("projection", tmp_path)
    assert [r.path.name for r in found] == ["good.json"]
    assert len(notes) == 1 and "bad.json" in notes[0] and "rows[0].img_sec" in notes[0]


# ---------------------------------------------------------------------------------------
# the validator itself


def test_a_field_is_named_by_its_dotted_path_and_what_is_wrong_with_it():
    fields = [validate.whole("summary.workers", 1),
              validate.number("samples.loss.*", finite=False),
              validate.number("samples.seconds.*", 0, above=True)]
    validate.check({"summary": {"workers": 2}, "samples": {"loss": [math.nan],
                                                           "seconds": [1.0]}}, fields)
    for doc, message in [
        ({"summary": {"workers": 0}}, "summary.workers is 0, not >= 1"),
        ({"summary": {"workers": True}}, "summary.workers is true, not a whole number"),
        ({"summary": {}}, "summary.workers is missing"),
        ({"summary": {"workers": 1}, "samples": {"seconds": [1.0, 0.0]}},
         "samples.seconds[1] is 0.0, not > 0"),
        ({"summary": {"workers": 1}, "samples": {"seconds": [-math.inf]}},
         "samples.seconds[0] is -Infinity, not a finite number"),
        ({"summary": 3}, "summary is 3, not a section"),
    ]:
        with pytest.raises(validate.Invalid) as caught:
            validate.check(doc, fields)
        assert str(caught.value) == message


@pytest.mark.parametrize("directory, kind", [(RUNS, "run"), (TARGET, "accuracy")])
def test_a_run_on_a_crowded_machine_is_read_and_flagged(tmp_path, directory, kind):
    # what a run records when CPU workers outnumber a machine's cores, and a run
    # trained to accuracy without --eval-every (its interval chosen for it)
    doc = fixture_doc("*n2*", directory)
    doc["summary"]["oversubscribed"] = {"machine": "vm", "workers": 4, "physical_cores": 2}
    if kind == "accuracy":
        doc["config"]["eval_every"] = None
    (tmp_path / "crowded.json").write_text(store.to_json(doc))
    read_in, notes = reader.read([tmp_path])
    assert notes == [] and len(read_in[kind]) == 1
    assert read_in[kind][0].oversubscribed is True
