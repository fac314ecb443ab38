"""The `horovod` plugin: listed with a reason where Horovod is missing, refused under
launchers Horovod cannot use, and — where Horovod is installed — real jobs through
horovodrun (gloo and MPI controllers) and mpiexec, and agreement with `allreduce`.

Where Horovod is not installed the real-job tests skip; with COMMBENCH_REQUIRE_ENGINES=1 they fail
instead (CI installs Horovod: a skipped engine test is not a pass).
"""

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from commbench import registry
from commbench.config.run_config import RunConfig
from commbench.errors import UsageError
from commbench.launch.detect import LaunchInfo
from launchers import BIN, TINY_RUN, mpiexec, only_result, run

PROGRAMS = Path(__file__).resolve().parent / "programs"


def horovod_or_skip():
    missing = importlib.util.find_spec("horovod") is None
    if missing or not (BIN / "horovodrun").exists() and not shutil.which("horovodrun"):
        why = "horovod is not installed (bash scripts/install_horovod.sh)"
        if os.environ.get("COMMBENCH_REQUIRE_ENGINES") == "1":
            pytest.fail(f"CI must test the horovod plugin for real: {why}")
        pytest.skip(why)


def horovodrun(options, args, timeout=240, cwd=None):
    """`horovodrun OPTIONS python ARGS` as a user types it (this environment's python
    first on PATH), with a hard timeout (launchers.run kills every rank it started)."""
    exe = str(BIN / "horovodrun") if (BIN / "horovodrun").exists() else shutil.which("horovodrun")
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return run([exe, *options, "python", *args], timeout, env=env, cwd=cwd)


# --- everywhere ---------------------------------------------------------------------

def test_listed_with_a_reason_when_horovod_is_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("horovod") else real(name, *a))
    rows = {r["name"]: r for r in registry.describe_all()}
    assert rows["horovod"]["usable"] is False
    assert "needs horovod" in rows["horovod"]["why_not"]
    assert "scripts/install_horovod.sh" in rows["horovod"]["why_not"]
    assert rows["horovod"]["source"] == "commbench"


def test_refused_under_torchrun_before_any_communication():
    cls = registry.resolve("horovod")
    with pytest.raises(UsageError, match="horovod cannot run under torchrun"):
        cls.check(RunConfig(dist_optimizer="horovod"), LaunchInfo("torchrun", 0, 2, 0, 2, 0))


# --- real jobs (Horovod installed) -------------------------------------------------

@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("options, controller, extra", [
    (["-np", "4", "-H", "localhost:4", "--gloo"], "gloo", []),
    # The card's line as typed: MPI mode (Horovod's default when built with MPI), its
    # one-dash -bind-to/-map-by taken by the front of `commbench setup-mpirun`.
    (["-np", "2"], "mpi", ["--fp16-allreduce", "--hierarchical-allreduce"]),
    (["-np", "2", "-H", "localhost:2"], "mpi", []),
])
def test_horovodrun_writes_a_normal_result(tmp_path, options, controller, extra):
    horovod_or_skip()
    workers = int(options[1])
    done = horovodrun(options, ["-m", "commbench", "--dist-optimizer=horovod",
                                "--results-dir", str(tmp_path), *TINY_RUN, *extra], cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    doc = only_result(tmp_path)
    # In MPI mode horovodrun starts the ranks through mpirun, which exports only its own
    # variables.
    assert doc["environment"]["launcher"] == {"gloo": "horovodrun", "mpi": "openmpi"}[controller]
    assert doc["environment"]["world_size"] == workers == doc["summary"]["workers"]
    assert doc["environment"]["packages"]["horovod"]
    facts = doc["strategy"]
    assert facts["name"] == "horovod" and facts["controller"] == controller
    assert facts["horovod_version"] == doc["environment"]["packages"]["horovod"]
    assert facts["compression"] == ("fp16" if "--fp16-allreduce" in extra else "none")
    assert facts["hierarchical_allreduce"] == ("--hierarchical-allreduce" in extra)
    # Horovod averages gradients from equal starting points: every rank ends equal.
    assert doc["summary"]["parameters_identical"] is True
    assert doc["summary"]["total_img_sec"]["mean"] > 0
    assert done.stdout.count("Iter #") == 3
    # On the wire: every gradient as Horovod's compression handed it over (fp16: half),
    # sent as a ring allreduce; Horovod fuses them into messages it does not show.
    import torchvision

    model = torchvision.models.resnet18(num_classes=doc["config"]["num_classes"])
    handed = sum(p.numel() * (2 if "--fp16-allreduce" in extra else 4)
                 for p in model.parameters())
    sent = doc["summary"]["wire"]
    assert sent["bytes_per_step"] == pytest.approx(2 * (workers - 1) / workers * handed,
                                                   rel=1e-3)
    assert sent["messages_per_step"] is None and sent["communicating_steps"] == 1.0
    assert "messages the engine fused out of sight" in done.stdout


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_adasum_under_mpiexec(tmp_path):
    horovod_or_skip()
    done = mpiexec(2, ["-m", "commbench", "--dist-optimizer=horovod", "--use-adasum",
                       "--results-dir", str(tmp_path), *TINY_RUN], timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    assert doc["environment"]["launcher"] == "openmpi"
    assert (doc["strategy"]["op"], doc["strategy"]["controller"]) == ("adasum", "mpi")
    assert doc["summary"]["parameters_identical"] is True
    assert doc["summary"]["wire"] is None  # Adasum is no ring: not claimed
    assert "On the wire: not measured" in done.stdout


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_a_timeline_links_horovods_own_beside_commbenchs(tmp_path):
    horovod_or_skip()
    trace = tmp_path / "trace.json"
    done = mpiexec(2, ["-m", "commbench", "--dist-optimizer=horovod", "--timeline", str(trace),
                       "--results-dir", str(tmp_path / "r"), *TINY_RUN], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    engine = tmp_path / "trace.horovod.json"
    assert f"The engine's own timeline: {engine}" in done.stdout
    assert only_result(tmp_path / "r")["strategy"]["engine_timeline"] == str(engine)
    events = json.loads(engine.read_text())  # Horovod writes a JSON array of trace events
    assert any(e.get("name") == "ALLREDUCE" for e in events)
    ours = json.loads(trace.read_text())["traceEvents"]
    waits = [e for e in ours if e.get("cat") == "wait"]  # its synchronize() before the step
    assert {e["pid"] for e in waits} == {0, 1}
    handed = [e for e in ours if e.get("cat") == "handed"]  # each gradient, as handed over
    assert {e["pid"] for e in handed} == {0, 1}


@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("workers", [2, 3])
def test_horovod_agrees_with_allreduce(tmp_path, workers):
    """Same initial parameters and data, two SGD steps with momentum: torch DDP and
    Horovod's DistributedOptimizer end with the same parameters on every rank, up to
    the order of float32 additions (1e-9 relative after one step, 1e-7 after two).
    Later steps can amplify that rounding past any fixed tolerance: one ReLU or
    max-pool decision flipped by 1e-7 moves a batch-8 BatchNorm network by 1e-4."""
    horovod_or_skip()
    done = mpiexec(workers, [str(PROGRAMS / "engine_agreement.py"), "allreduce", "horovod",
                             "--steps", "2"],
                   timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(out for out in done.stdout.splitlines() if out.startswith("AGREEMENT "))
    ranks = json.loads(line.split(" ", 1)[1])
    assert len(ranks) == workers
    for r in ranks:
        assert r["moved"] > 1e-4  # the steps changed the parameters
        assert r["max_rel"] < 1e-5 and r["max_abs"] < 1e-4, ranks


def test_a_horovod_without_gpu_operations_refuses_cuda(monkeypatch):
    """Horovod built for the CPU would move CUDA tensors through host memory."""
    from types import SimpleNamespace

    import torch

    horovod_or_skip()
    import horovod.torch as hvd

    for name, value in (("init", None), ("rank", 0), ("size", 1), ("nccl_built", 0)):
        monkeypatch.setattr(hvd, name, lambda value=value: value)
    ctx = SimpleNamespace(device=torch.device("cuda", 0), rank=0, world_size=1)
    plugin = registry.resolve("horovod")(ctx, RunConfig(dist_optimizer="horovod"))
    with pytest.raises(UsageError, match="built without GPU operations"):
        plugin.wrap(torch.nn.Linear(2, 2), torch.optim.SGD([torch.zeros(1)], lr=0.1))


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("options", [["-np", "2", "--gloo", "-H", "localhost:2"], ["-np", "2"]])
def test_microbench_sets_horovods_allreduce_against_the_bare_collectives(tmp_path, options):
    horovod_or_skip()
    done = horovodrun(options, ["-m", "commbench", "microbench", "--op", "horovod", "-b", "4K",
                                "-e", "1M", "-f", "16", "-n", "3", "-w", "1",
                                "--results-dir", str(tmp_path)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    doc = only_result(tmp_path)
    assert doc["summary"]["wrong"] == 0  # Horovod's average checked against the reference
    rows = [r for r in doc["rows"] if r["op"] == "horovod"]
    assert {r["bytes"] for r in rows} == {4096, 65536, 1 << 20}
    impls = {r["impl"] for r in rows}
    assert {"commbench", "torch all_reduce"} <= impls
    assert ("MPI Allreduce" in impls) == ("--gloo" not in options)
    assert all(r["transport"] is None for r in rows)  # Horovod decides what carries it
