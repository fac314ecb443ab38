"""The `bluefog.*` plugins: listed with a reason where Bluefog is missing, refused
where Bluefog cannot run, and — in the Bluefog environment (Python 3.9, torch 1.10,
scripts/setup_bluefog_env.sh) — real jobs through `bfrun` and agreement with
commbench's own implementations of the same strategies.

The Bluefog environment is found by COMMBENCH_BLUEFOG_PYTHON (its python), else
.venv-bluefog/ in the checkout, else this interpreter if it has bluefog. Without it
the real-job tests skip; with COMMBENCH_REQUIRE_ENGINES=1 they fail (a skipped engine test
is not a pass).

Every Bluefog job runs under a hard timeout, and a job that hangs fails its test:
the plugins make Bluefog's waits release the GIL (optimizers/bluefog.py), without
which Bluefog 0.3.0's optimizers deadlock with torch >= 1.10.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from commbench import registry
from commbench.config.run_config import RunConfig
from commbench.errors import UsageError
from commbench.launch.detect import LaunchInfo
from launchers import only_result, run

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "tests" / "programs"
ENGINES = ["bluefog.neighbor_allreduce", "bluefog.hierarchical_neighbor_allreduce",
           "bluefog.gradient_allreduce", "bluefog.win_put"]
# A real convolutional network, small enough for many jobs on 2 cores.
SMALL = ["--model", "squeezenet1_1", "--num-classes", "10", "--image-size", "64",
         "--batch-size", "8"]
TINY_RUN = SMALL + ["--num-warmup-batches", "1", "--num-batches-per-iter", "2",
                    "--num-iters", "3", "--reference-iters", "1", "--reference-seconds", "0",
                    "--timeout", "60"]


def bluefog_python():
    candidates = [os.environ.get("COMMBENCH_BLUEFOG_PYTHON"),
                  str(ROOT / ".venv-bluefog" / "bin" / "python")]
    if importlib.util.find_spec("bluefog") is not None:
        candidates.append(sys.executable)
    for c in candidates:
        if c and Path(c).exists() and Path(c).with_name("bfrun").exists():
            return c
    why = ("no Bluefog environment (bash scripts/setup_bluefog_env.sh, or set "
           "COMMBENCH_BLUEFOG_PYTHON)")
    if os.environ.get("COMMBENCH_REQUIRE_ENGINES") == "1":
        pytest.fail(f"CI must test the Bluefog plugins for real: {why}")
    pytest.skip(why)


def bfrun(n, args, timeout=75, cwd=None, hosts=None, path_first=None):
    """`bfrun -np N [-H HOSTS] python ARGS` as typed in the Bluefog environment (and,
    given path_first, a shell that put that directory first on PATH), with a hard
    timeout: a job that hangs fails (launchers.run kills every rank it started)."""
    python = bluefog_python()
    bin_dir = Path(python).parent
    path = os.pathsep.join(filter(None, [path_first, str(bin_dir), os.environ["PATH"]]))
    # Every job here is meant to succeed: one that fails shows its traceback, not only
    # commbench's one line (a rare failure after the run has been seen only in CI).
    env = {"PATH": path, "PYTHONPATH": "", "VIRTUAL_ENV": str(bin_dir.parent),
           "COMMBENCH_DEBUG": "1"}
    # Its one-dash -bind-to/-map-by reach Open MPI 5 through the front that
    # setup_bluefog_env.sh installs (`commbench setup-mpirun`).
    hosts = ["-H", hosts] if hosts else []
    return run(["bfrun", "-np", str(n), *hosts, "python", *args], timeout, env=env, cwd=cwd)


def completed(done):
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


# --- everywhere ---------------------------------------------------------------------

def test_listed_with_a_reason_when_bluefog_is_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("bluefog") else real(name, *a))
    rows = {r["name"]: r for r in registry.describe_all()}
    for name in ENGINES:
        assert rows[name]["usable"] is False and rows[name]["source"] == "commbench"
        assert "needs bluefog" in rows[name]["why_not"]
        assert "setup_bluefog_env.sh" in rows[name]["why_not"]


@pytest.mark.parametrize("config, launch, message", [
    (RunConfig(), LaunchInfo("torchrun", 0, 2, 0, 2, 0), "only under an MPI launcher"),
    (RunConfig(fp16_allreduce=True), LaunchInfo("openmpi", 0, 2, 0, 2, 0),
     r"--fp16-allreduce: means nothing to bluefog\.\w+, which compresses nothing"),
])
def test_refused_before_any_communication(config, launch, message):
    for name in ENGINES:
        with pytest.raises(UsageError, match=message):
            registry.refuse_unread([name], config, launch=launch)
            registry.resolve(name).check(config, launch)


def test_a_language_model_without_transformers_is_refused_plainly(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    for name in ENGINES:
        with pytest.raises(UsageError, match=rf"argument --model: {name} cannot train lm-tiny: "
                           r"Bluefog's environment \(torch 1.10\) has no transformers"):
            registry.resolve(name).check(RunConfig(model="lm-tiny"),
                                         LaunchInfo("openmpi", 0, 2, 0, 2, 0))


def test_win_put_has_no_atc_style():
    with pytest.raises(UsageError, match="--atc-style: means nothing to bluefog.win_put"):
        registry.resolve("bluefog.win_put").check(RunConfig(atc_style=True),
                                                  LaunchInfo("openmpi", 0, 2, 0, 2, 0))


def test_hierarchical_cannot_simulate_machines():
    cls = registry.resolve("bluefog.hierarchical_neighbor_allreduce")
    with pytest.raises(UsageError, match="cannot be simulated"):
        cls.check(RunConfig(machine_size=2), LaunchInfo("openmpi", 0, 4, 0, 4, 0))


# --- real jobs in the Bluefog environment -------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("engine, extra", [
    ("bluefog.neighbor_allreduce", []),                              # dynamic one-peer
    ("bluefog.neighbor_allreduce", ["--disable-dynamic-topology"]),  # static exponential-2
    ("bluefog.neighbor_allreduce", ["--atc-style", "--topology", "ring"]),
    ("bluefog.gradient_allreduce", []),
    ("bluefog.win_put", []),                                         # dynamic one-peer
    ("bluefog.win_put", ["--disable-dynamic-topology"]),             # static exponential-2
])
def test_bfrun_writes_a_normal_result(tmp_path, engine, extra):
    completed(bfrun(4, ["-m", "commbench", f"--dist-optimizer={engine}",
                        "--results-dir", str(tmp_path), *TINY_RUN, *extra], cwd=tmp_path))
    doc = only_result(tmp_path)
    env = doc["environment"]
    assert env["world_size"] == 4 and env["launcher"] == "openmpi"
    assert env["python"].startswith("3.9") and env["packages"]["torch"].startswith("1.10")
    assert env["packages"]["bluefog"] == doc["strategy"]["bluefog_version"] == "0.3.0"
    assert doc["strategy"]["name"] == engine and doc["strategy"]["engine"] == "bluefog"
    assert doc["summary"]["total_img_sec"]["mean"] > 0
    # Bluefog communicates inside its optimizer's step: no split rather than a wrong one
    assert doc["summary"]["step_split"] is None and doc["samples"]["step_split"] is None
    if engine == "bluefog.gradient_allreduce":
        assert doc["summary"]["parameters_identical"] is True
    else:
        assert doc["strategy"]["dynamic"] == ("--disable-dynamic-topology" not in extra)
        assert 0 <= doc["summary"]["final_consensus_distance"] < 1


@pytest.mark.mpi
def test_bfrun_refuses_a_language_model_in_one_line(tmp_path):
    """Bluefog's torch 1.10 environment has no transformers: refused on every rank alike,
    before anything runs (docs/run.md, "Language models")."""
    done = bfrun(2, ["-m", "commbench", "--dist-optimizer=bluefog.neighbor_allreduce",
                     "--model", "lm-tiny", "--seq-len", "32", "--batch-size", "2",
                     "--results-dir", str(tmp_path)], cwd=tmp_path)
    errors = {line for line in done.stderr.splitlines() if line.startswith("commbench:")}
    assert done.returncode != 0 and len(errors) == 1, done.stderr[-3000:]
    assert all(word in next(iter(errors)) for word in ("argument --model", "lm-tiny",
                                                       "transformers"))
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("*.json"))


@pytest.mark.mpi
def test_bluefog_writes_its_own_timeline_beside_commbenchs(tmp_path):
    trace = tmp_path / "trace.json"
    done = completed(bfrun(2, ["-m", "commbench", "--dist-optimizer=bluefog.neighbor_allreduce",
                               "--results-dir", str(tmp_path / "r"), *TINY_RUN,
                               "--timeline", str(trace)], cwd=tmp_path))
    doc = only_result(tmp_path / "r")
    assert doc["strategy"]["engine_timeline"] == str(tmp_path / "trace.bluefog.<rank>.json")
    assert f"The engine's own timeline: {tmp_path / 'trace.bluefog.<rank>.json'}" in done.stdout
    ours = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in ours if e["ph"] == "X" and e["cat"] == "step"} == {0, 1}
    for rank in (0, 1):
        # Bluefog writes its events as it goes and leaves the array open (Chrome and
        # Perfetto accept that)
        text = (tmp_path / f"trace.bluefog.{rank}.json").read_text().rstrip().rstrip(",")
        names = {e.get("name") for e in json.loads(text + "]")}
        assert {"FORWARD", "COMMUNICATE"} <= names


def test_a_bluefog_timeline_that_exists_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("BLUEFOG_TIMELINE", raising=False)
    (tmp_path / "trace.bluefog.0.json").write_text("[]")
    config = RunConfig(timeline=str(tmp_path / "trace.json"))
    with pytest.raises(UsageError, match=r"trace.bluefog.0.json \(Bluefog's own timeline\) exists"):
        registry.resolve("bluefog.neighbor_allreduce").check(
            config, LaunchInfo("openmpi", 0, 2, 0, 2, 0))
    assert "BLUEFOG_TIMELINE" not in os.environ


def agreement(tmp_path, workers, first, second, extra=(), timeout=75, **where):
    done = completed(bfrun(workers, [str(PROGRAMS / "engine_agreement.py"), first, second,
                                     *SMALL, "--steps", "2", "--timeout", "60", *extra],
                           timeout=timeout, cwd=tmp_path, **where))
    line = next(out for out in done.stdout.splitlines() if out.startswith("AGREEMENT "))
    ranks = json.loads(line.split(" ", 1)[1])
    assert len(ranks) == workers
    return ranks


@pytest.mark.mpi
@pytest.mark.parametrize("workers, extra", [
    (4, ["--disable-dynamic-topology"]),                  # static exponential-2
    (4, []),                                              # dynamic one-peer
    (2, ["--atc-style", "--disable-dynamic-topology"]),
])
def test_bluefog_agrees_with_commbench_neighbor_allreduce(tmp_path, workers, extra):
    """Same initial parameters, same per-rank data, same W per step: Bluefog's
    optimizer and commbench's neighbor_allreduce end with the same parameters on
    every rank, up to the order of float32 additions."""
    for r in agreement(tmp_path, workers, "neighbor_allreduce", "bluefog.neighbor_allreduce",
                       extra):
        assert r["moved"] > 1e-4
        assert r["max_rel"] < 1e-5 and r["max_abs"] < 1e-4, r


@pytest.mark.mpi
def test_bluefog_agrees_with_commbench_gradient_allreduce(tmp_path):
    for r in agreement(tmp_path, 4, "gradient_allreduce", "bluefog.gradient_allreduce"):
        assert r["moved"] > 1e-4
        assert r["max_rel"] < 1e-5 and r["max_abs"] < 1e-4, r


@pytest.mark.mpi
@pytest.mark.parametrize("workers, topology", [(4, "exponential-2"), (4, "ring"), (3, "ring"),
                                               (4, "mesh-2d")])
def test_bluefog_neighbor_allreduce_agrees_with_commbench_exchange(tmp_path, workers,
                                                                   topology):
    """The primitive itself, one blocking call: Bluefog's neighbor_allreduce on
    commbench's W equals commbench's exchange to float32 rounding."""
    done = completed(bfrun(workers, [str(PROGRAMS / "bluefog_primitive.py"), topology],
                           cwd=tmp_path))
    line = next(out for out in done.stdout.splitlines() if out.startswith("PRIMITIVE "))
    ranks = json.loads(line.split(" ", 1)[1])
    assert len(ranks) == workers and max(ranks) < 1e-6, ranks


def win_put(tmp_path, workers, mode, topology, steps):
    done = completed(bfrun(workers, [str(PROGRAMS / "bluefog_win_put.py"), mode, topology,
                                     str(steps)], cwd=tmp_path))
    line = next(out for out in done.stdout.splitlines() if out.startswith("WINPUT "))
    ranks = json.loads(line.split(" ", 1)[1])
    assert len(ranks) == workers
    return ranks


@pytest.mark.mpi
@pytest.mark.parametrize("workers, topology", [(4, "exponential-2"), (3, "ring")])
def test_win_put_windows_in_lockstep_reach_the_average(tmp_path, workers, topology):
    """The windows bluefog.win_put makes, on commbench's W, driven in lockstep (put,
    meet, average): every rank reaches the average of the first parameters, as a
    doubly stochastic W must."""
    for r in win_put(tmp_path, workers, "lockstep", topology, 60):
        assert r["before"] > 0.05 and r["after"] < 1e-4, r


@pytest.mark.mpi
def test_win_put_steps_without_local_updates_reach_one_value(tmp_path):
    """The plugin's own steps (learning rate 0): puts land while their targets run on,
    so the ranks agree on one value near the first average, not at it. How near depends
    on when each put lands (about half the first distance here, more on a loaded box);
    an average of the ranks' values can never leave their span: the largest first
    distance bounds it."""
    ranks = win_put(tmp_path, 4, "steps", "exponential-2", 40)
    widest = max(r["before"] for r in ranks)
    for r in ranks:
        assert r["spread"] < 0.01 * r["before"], r
        assert r["after"] < widest, (r, widest)
