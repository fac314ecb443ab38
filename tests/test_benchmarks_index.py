"""benchmarks/ as a set (benchmarks/README.md): every file there is in the index, every
command the docs give names a file, a contender or a study that exists, and the A/B
driver's table and the study specs load and agree with the index. Nothing is run."""

import argparse
import ast
import copy
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from commbench.config.run_config import add_run_arguments

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
INDEX = (BENCHMARKS / "README.md").read_text()
# where commands that name benchmark scripts are written (CHANGELOG.md is history)
DOCS = [ROOT / "README.md", ROOT / "Makefile", BENCHMARKS / "README.md",
        BENCHMARKS / "gpu_check.sh", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"benchmarks/[\w/.-]+\.(?:py|sh|json)")


def _load(path: Path):
    """A benchmarks module by path, its folder first on sys.path as when run."""
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


CONTENDERS = _load(BENCHMARKS / "ab" / "contenders.py").CONTENDERS
STUDY = _load(BENCHMARKS / "studies" / "study.py")


def _functions(path: Path):
    return {node.name for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef)}


def test_every_file_under_benchmarks_is_in_the_index():
    files = [p.relative_to(ROOT).as_posix() for p in BENCHMARKS.rglob("*")
             if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts]
    assert files
    assert [f for f in files if f not in INDEX] == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_in_the_docs_names_what_exists(doc):
    text = doc.read_text()
    assert [p for p in PATH.findall(text) if not (ROOT / p).is_file()] == []
    assert [n for n in re.findall(r"ab\.py ([a-z_]+)", text) if n not in CONTENDERS] == []
    studies = STUDY.specs()
    assert [n for n in re.findall(r"study\.py ([a-z_]+)", text) if n not in studies] == []


def test_the_contender_table_loads_and_matches_the_index():
    arms = _functions(BENCHMARKS / "ab" / "arms.py")
    run_flags = {a.dest for a in _run_parser()._actions} | {"rounds"}
    assert {"allreduce", "horovod", "bluefog", "timeline", "data"} <= set(CONTENDERS)
    for name, c in CONTENDERS.items():
        assert name == c.name and bool(c.arms) != bool(c.runner), name
        if c.arms:
            assert c.arms in arms, name
            assert set(c.defaults) <= run_flags, name
        else:
            module, function = c.runner.split(":")
            assert function in _functions(BENCHMARKS / "ab" / f"{module}.py"), name
        assert f"ab.py {name}" in c.command
        # the index gives the same command and the same target as the table
        assert f"`{c.command}`" in INDEX and f"| {c.target} |" in INDEX, name
        assert f"| `{name}` |" in INDEX


def test_the_study_specs_load_and_match_the_index():
    specs = STUDY.specs()
    assert {"time_to_accuracy", "quick_sweep_stability"} <= set(specs)
    for name, spec in specs.items():
        assert spec["kind"] in STUDY.KINDS, name
        assert f"`{spec['command']}`" in INDEX and f"study.py {name}" in spec["command"]
        if spec.get("target"):
            assert f"| {spec['target']} |" in INDEX, name
        # every choice of every option with choices, each filling in every flag list
        choices = [[]] + [[f"--{o.replace('_', '-')}", c]
                          for o, option in spec.get("options", {}).items()
                          for c in option.get("choices", {})]
        for chosen in choices:
            args, extra = STUDY.options(name, spec, chosen)
            assert extra == []
            if spec["kind"] == "sweeps":
                each = spec["for_each"]
                value = getattr(args, each["option"]).split(each.get("split", ","))[0]
                values = dict(vars(args), **{each["as"]: value, each["as"] + "_slug": value})
                for part in [*spec["placement"], *spec["sweeps"], {"flags": spec["common"]}]:
                    made = STUDY.flags(part["flags"], values, spec)
                    assert "None" not in made or not values[part["if"]], name  # unset: unused
                for then in spec["then"]:
                    STUDY.flags(then, values, spec)


def test_the_parity_table_sets_each_strategy_against_the_reference(tmp_path, capsys):
    """Two real runs of lm-tiny, the second recorded as allreduce with bf16: its loss gap
    and bytes ratio are computed against the first's, each from its last evaluation."""
    fixtures = sorted((ROOT / "tests" / "data" / "lm-loss").glob("*.json"))
    docs = [json.loads(f.read_text()) for f in fixtures]
    docs[1]["strategy"]["compression"] = "bf16"
    for fixture, doc in zip(fixtures, docs):
        (tmp_path / fixture.name).write_text(json.dumps(doc))
    (reference, bf16) = [(d["curve"][-1]["validation_loss"], d["summary"]["bytes_sent"])
                         for d in docs]
    STUDY.parity(tmp_path, "allreduce")
    out = capsys.readouterr().out
    assert "floor of the loss 0.9463 nats/token" in out
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines()[3:]}
    assert rows["allreduce"][1:] == ["120", "1", f"{reference[0]:.4f}", "+0.00%",
                                     f"{reference[1] / 1e6:.1f}", "1.00"]
    gap = 100 * (bf16[0] - reference[0]) / reference[0]
    assert rows["allreduce (bf16)"][2:] == ["40", "1", f"{bf16[0]:.4f}", f"{gap:+.2f}%",
                                            f"{bf16[1] / 1e6:.1f}",
                                            f"1/{reference[1] / bf16[1]:.3g}"]
    STUDY.parity(tmp_path, "diloco (H=100)")
    assert capsys.readouterr().out.startswith(f"parity: no diloco (H=100) run in {tmp_path}")


def test_the_time_to_accuracy_study_plans_its_sweeps(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(STUDY, "run_to_its_end", ran.append)
    STUDY.main(["time_to_accuracy", "--partitions", "iid", "--emulate", "4x1",
                "--time-budget", "600"])
    sweeps = [shlex.join(c[1:]) for c in ran if c[3] == "sweep"]
    assert len(sweeps) == 3 and len(ran) == 5  # the strategies, two variants; report, plot
    assert sweeps[0].startswith("-m commbench sweep --emulate 4x1 --link 200mbit "
                                "--dist-optimizer allreduce,neighbor_allreduce,")
    assert "--results-dir time-to-accuracy/results/iid" in sweeps[0]
    assert sweeps[0].endswith("--partition iid --target-accuracy 0.8 --time-budget 600")
    assert "--disable-dynamic-topology" in sweeps[1] and "--no-broadcast-buffers" in sweeps[2]
    assert ran[3][3:] == ["report", "time-to-accuracy/results/iid"]
    assert "wall time of the study" in capsys.readouterr().out


def test_a_dry_run_of_a_study_prints_its_report_and_plot_but_runs_neither(monkeypatch,
                                                                          capsys):
    ran = []
    monkeypatch.setattr(STUDY, "run_to_its_end", ran.append)
    STUDY.main(["failure_recovery", "--rates", "none;mtbf=60s,seed=1", "--dry-run"])
    assert [c[3] for c in ran] == ["sweep"] * 8  # 4 contenders x 2 schedules, dry runs
    assert all(c[-1] == "--dry-run" for c in ran)
    out = capsys.readouterr().out
    assert out.count("$ commbench report failure-recovery/results") == 2


def test_a_study_s_workload_brings_its_own_flags_and_defaults(monkeypatch):
    ran = []
    monkeypatch.setattr(STUDY, "run_to_its_end", ran.append)
    STUDY.main(["failure_recovery", "--workload", "lm", "--rates", "none",
                "--contenders", "diloco"])
    sweep = shlex.join(ran[0][1:])
    assert "--model lm-tiny" in sweep and "--target-loss 1.2 --eval-every 20" in sweep
    assert "--average-every 20 " in sweep and "--results-dir failure-recovery-lm/" in sweep
    assert "resnet18" not in sweep and "--target-accuracy" not in sweep
    ran.clear()
    STUDY.main(["failure_recovery", "--rates", "none", "--contenders", "diloco",
                "--target", "0.7", "--h", "8"])
    sweep = shlex.join(ran[0][1:])
    assert "--target-accuracy 0.7" in sweep and "--average-every 8 " in sweep
    with pytest.raises(SystemExit):
        STUDY.main(["failure_recovery", "--workload", "text"])
    # a choice may set only options that default to null: a default would hide it
    spec = copy.deepcopy(STUDY.specs()["failure_recovery"])
    spec["options"]["target"]["default"] = "0.8"
    with pytest.raises(SystemExit, match="--workload's choices set --target"):
        STUDY.options("failure_recovery", spec, ["--workload", "lm"])


def test_the_language_model_studies_share_one_task_whose_defaults_an_option_overrides(
        monkeypatch):
    ran = []
    monkeypatch.setattr(STUDY, "run_to_its_end", ran.append)
    monkeypatch.setattr(STUDY, "parity", lambda *args: None)
    task = ("--model lm-tiny --seq-len 16 --batch-size 4 --data "
            "language:vocab={},order=1,samples=16000 --max-epochs 1 --warmup-epochs 0.05 ")
    for argv in (["lm_winner_map", "--links", "shm"], ["diloco_regime", "--seeds", "1"],
                 ["failure_recovery", "--workload", "lm", "--rates", "none",
                  "--contenders", "gossip"]):
        ran.clear()
        STUDY.main(argv)
        assert task.format(64) in shlex.join(ran[0][1:]), argv
    ran.clear()
    STUDY.main(["diloco_regime", "--seeds", "1", "--vocab", "32"])
    assert task.format(32) in shlex.join(ran[0][1:])


def test_the_diloco_regime_study_gives_every_contender_the_same_steps(monkeypatch, capsys):
    ran, tables = [], []
    monkeypatch.setattr(STUDY, "run_to_its_end", ran.append)
    monkeypatch.setattr(STUDY, "parity", lambda *args: tables.append(args))
    STUDY.main(["diloco_regime", "--seeds", "1", "--link", "100mbit"])
    sweeps = [shlex.join(c[1:]) for c in ran if c[3] == "sweep"]
    assert len(sweeps) == 10 and ran[-1][3:] == ["report", "diloco-regime/results/order1"]
    assert all(s.startswith("-m commbench sweep --emulate 4x1 --link 100mbit --dist-optimizer")
               and s.endswith("--repeat 1 --results-dir diloco-regime/results/order1 "
                              "--plots-dir diloco-regime/charts --model lm-tiny --seq-len 16 "
                              "--batch-size 4 --data language:vocab=64,order=1,samples=16000 "
                              "--max-epochs 1 --warmup-epochs 0.05 --eval-every 100 "
                              "--job-timeout 3600") for s in sweeps)
    contenders = sorted(s.split(" --repeat")[0].split("--dist-optimizer ")[1] for s in sweeps)
    assert contenders == [
        "allreduce", "allreduce --compression bf16", "allreduce --compression powersgd:4",
        *(f"{name} --average-every {h}" for name in ("diloco", "local_sgd")
          for h in (100, 20, 500)), "neighbor_allreduce"]
    assert tables == [(Path("diloco-regime/results/order1"), "allreduce")]
    STUDY.main(["diloco_regime", "--seeds", "1"])
    assert shlex.join(ran[-2][1:]).startswith("-m commbench sweep --np 4 --oversubscribe ")


def make_study(tmp_path, cores: int):
    """The sweep flags `make study` gives on a machine of `cores` (nproc faked)."""
    (tmp_path / "nproc").write_text(f"#!/bin/sh\necho {cores}\n")
    (tmp_path / "nproc").chmod(0o755)
    done = subprocess.run(["make", "-n", "-C", str(ROOT), "study", "ENV_DONE="],
                          capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    line = [line for line in done.stdout.splitlines() if " sweep " in line]
    assert len(line) == 1, done.stdout
    return shlex.split(line[0].split(" sweep ", 1)[1])


@pytest.mark.parametrize("cores, workers", [(1, "1"), (2, "1,2"), (3, "1,2"), (4, "1,2,4"),
                                            (16, "1,2,4")])
def test_make_runs_no_more_workers_than_cores(tmp_path, cores, workers):
    flags = _pairs(make_study(tmp_path, cores))
    assert flags["--np"] == workers and flags["--machine-size"] == "1"
    assert flags["--dist-optimizer"] == ("allreduce,neighbor_allreduce,"
                                         "hierarchical_neighbor_allreduce,none")


def test_on_shared_memory_only_sweeps_with_machines_get_a_machine_size(monkeypatch, tmp_path):
    from cli_helpers import commbench

    ran = []
    monkeypatch.setattr(STUDY, "run_to_its_end", ran.append)
    STUDY.main(["time_to_accuracy", "--partitions", "iid"])
    sweeps = [c for c in ran if c[3] == "sweep"]
    assert ["--machine-size" in c for c in sweeps] == [True, True, False]
    assert "--no-broadcast-buffers" in sweeps[2]  # allreduce alone: it has no machines
    for command in sweeps:  # each plans without refusing a flag
        done = commbench(*command[3:], "--dry-run", cwd=tmp_path)
        assert done.returncode == 0, done.stderr


def test_the_stability_study_runs_the_sweep_make_runs_on_this_2_core_machine(tmp_path):
    spec = STUDY.specs()["quick_sweep_stability"]["sweep"]
    assert _pairs(spec) == _pairs(make_study(tmp_path, 2))


def _pairs(flags):
    """{flag: value} of a flag list (a flag without a value: True)."""
    out, i = {}, 0
    while i < len(flags):
        takes = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        out[flags[i]] = flags[i + 1] if takes else True
        i += 2 if takes else 1
    return out


def _run_parser():
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser


def test_the_periodic_study_can_run_allreduce_with_each_workers_statistics(monkeypatch):
    ran = []
    monkeypatch.setattr(STUDY, "run_to_its_end", ran.append)
    STUDY.main(["periodic_to_accuracy", "--partitions", "iid"])
    sweeps = [shlex.join(c[1:]) for c in ran if c[3] == "sweep"]
    assert "--dist-optimizer allreduce,neighbor_allreduce " in sweeps[0]
    assert not any("--no-broadcast-buffers" in s for s in sweeps)
    ran.clear()
    STUDY.main(["periodic_to_accuracy", "--partitions", "dirichlet:0.1",
                "--strategies", "neighbor_allreduce", "--variants", "allreduce"])
    sweeps = [shlex.join(c[1:]) for c in ran if c[3] == "sweep"]
    assert "--dist-optimizer neighbor_allreduce " in sweeps[0]
    assert "--dist-optimizer allreduce --no-broadcast-buffers " in sweeps[1]
    assert len(sweeps) == 6  # the two above, local_sgd and diloco at two periods each
