"""Precision: --amp (bf16 for real on the CPU; fp16's loss-scaling plumbing with torch's
CPU GradScaler), and float16 communication that must not lose small updates or
overflow."""

import copy
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from commbench.job import precision
from commbench.analysis.reading import precision_of
from commbench.errors import UsageError
from launchers import TINY_RUN

cpu_scaler = pytest.mark.skipif(not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"),
                                reason="torch.amp.GradScaler('cpu') needs torch >= 2.3")


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def test_bf16_runs_the_forward_under_autocast_and_returns_float32():
    model, optimizer = small_model(), None
    wrapped, _ = precision.mixed_precision(model, optimizer, "bf16", torch.device("cpu"))
    seen = []
    model[0].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    out = wrapped(torch.randn(2, 8))
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    assert precision.mixed_precision(model, optimizer, "off", None) == (model, None)


def test_fp16_needs_a_gpu():
    with pytest.raises(UsageError, match="--amp: fp16 needs a GPU"):
        precision.check("fp16", "cpu")
    precision.check("bf16", "cpu")
    precision.check("fp16", "cuda")


@cpu_scaler
def test_loss_scaling_scales_the_gradients_and_the_step_unscales_them():
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    plain = small_model()
    scaled = copy.deepcopy(plain)
    reference = torch.optim.SGD(plain.parameters(), lr=0.1)
    optimizer = torch.optim.SGD(scaled.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    precision._step_through(optimizer, scaler)
    model = precision.Autocast(scaled, "cpu", torch.bfloat16, scaler)
    train_step(model, optimizer, x, y)
    grad = scaled[0].weight.grad.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        train_step(lambda v: plain(v).float(), reference, x, y)
    # The gradients were computed scaled, and unscaled before the step.
    assert torch.allclose(grad, plain[0].weight.grad, rtol=0.05, atol=1e-3)
    for a, b in zip(scaled.parameters(), plain.parameters()):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4)
    # An inf gradient: the step is skipped and the scale goes down.
    before = [p.detach().clone() for p in scaled.parameters()]
    bad = torch.full((4, 8), float("inf"))
    train_step(model, optimizer, bad, y)
    assert all(torch.equal(a, b) for a, b in zip(before, scaled.parameters()))
    assert scaler.get_scale() < 1024.0


def test_results_are_grouped_by_precision():
    assert precision_of({}) == "fp32"
    assert precision_of({"fp16_allreduce": True}) == "fp16-allreduce"
    assert precision_of({"amp": "bf16"}) == "amp-bf16"
    assert precision_of({"amp": "fp16", "fp16_allreduce": True}) == "amp-fp16+fp16-allreduce"
    # since --compression, the strategy's variant says it (commbench.analysis.reading)
    assert precision_of({"fp16_allreduce": True, "compression": "none"}) == "fp32"


@pytest.mark.job
def test_a_bf16_job_runs_and_records_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "commbench", "--amp", "bf16",
                           "--dist-optimizer", "none", "--results-dir", str(tmp_path),
                           *TINY_RUN], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""  # nothing at exit either
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["config"]["amp"] == "bf16"


@pytest.mark.job
def test_fp16_on_the_cpu_is_one_line_and_exit_2(tmp_path):
    for _ in range(3):  # the process ends without interpreter teardown: no abort at exit
        done = subprocess.run([sys.executable, "-m", "commbench", "--amp", "fp16",
                               "--no-cuda", "--results-dir", str(tmp_path), *TINY_RUN],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            "commbench: error: argument --amp: fp16 needs a GPU (its loss scaling is CUDA's); "
            "use --amp bf16 on the CPU"]


@pytest.fixture
def one_rank():
    from commbench.launch import distributed
    from commbench.launch.detect import LaunchInfo

    ctx = distributed.init_distributed(LaunchInfo("single", 0, 1, 0, 1, 0), True, 30)
    yield ctx
    distributed.leave_libraries()


def test_fp16_gradient_averaging_divides_before_it_sums(one_rank):
    from commbench.optimizers.gradient_allreduce import GradientAverager

    model = torch.nn.Linear(1, 1, bias=False)
    averager = GradientAverager(model, world_size=4, narrow=torch.float16)
    model.weight.grad = torch.full((1, 1), 96000.0)  # beyond float16's range
    averager._launch(model.weight)
    averager.wait()
    assert model.weight.grad.item() == 24000.0  # 96000 / 4, never inf


def test_fp16_machine_averaging_keeps_updates_below_float16_resolution(one_rank):
    from commbench.comm.machine_averaging import MachineAveraging
    from commbench.topology import build_schedule

    x = torch.full((4,), 1000.0) + 0.01  # float16 resolves 0.5 at 1000
    mixer = MachineAveraging([x], build_schedule("exponential-2", 1, dynamic=False), rank=0,
                             machine_size=1, narrow=torch.float16, overlapped=True)
    mixer.start()
    mixer.finish()
    assert torch.allclose(x, torch.full((4,), 1000.01))
