"""PowerSGD in projections (commbench.simulate.powersgd): what torch's hook sends, per
gradient and per bucket, against torch's own rule; and the command's rows and notes."""

import json
import math

import pytest
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

from cli_helpers import commbench
from commbench.simulate import powersgd
from commbench.simulate.compute import gradients
from test_simulate import STATED


@pytest.mark.parametrize("shape, rank, sent", [
    ((1000, 512), 4, (0, 4000, 2048)),  # a linear layer: P and Q
    ((64,), 4, (64, 0, 0)),  # a bias: whole
    ((64, 3, 7, 7), 4, (0, 256, 588)),  # a convolution, as 64 x 147
    ((3, 1000), 4, (3000, 0, 0)),  # the rank capped at 3, and then not worth it
])
def test_each_gradient_is_sent_whole_or_as_its_factors(shape, rank, sent):
    assert powersgd.split(shape, rank, 2.0) == sent


@pytest.mark.parametrize("model", ["resnet18", "resnet50"])
@pytest.mark.parametrize("rank", [1, 4, 32])
def test_the_choice_is_torchs_own_for_every_layer(model, rank):
    grads = gradients(model, 32)
    for shape in grads.shapes:
        rows, columns = shape[0], math.prod(shape[1:]) if len(shape) > 1 else 1
        compress, _, _ = _should_compress(rows, columns, min(rows, columns, rank), 2.0)
        whole, p, q = powersgd.split(shape, rank, 2.0)
        assert compress == (whole == 0), shape


def test_each_bucket_sends_its_whole_gradients_then_ps_then_qs():
    grads = gradients("resnet18", 32)
    found = powersgd.messages(grads, 4, 2.0)
    assert len(grads.bucket_indices()) * 2 <= len(found) <= len(grads.bucket_indices()) * 3
    assert sum(b for b, _ in found) < grads.total / 60  # resnet18 at rank 4: ~1/73
    assert powersgd.compression_rate(grads, 4, 2.0) == pytest.approx(72.9, abs=0.1)
    readies = [r for _, r in found]
    assert readies == sorted(readies)  # buckets in backward's order


def test_the_command_projects_powersgd_and_says_its_codec_was_not_measured(tmp_path):
    slow = [a if a != "25gbit" else "200mbit" for a in STATED]
    plain = commbench("simulate", *slow, "--np", "16", "--dist-optimizer", "allreduce",
                      "-o", tmp_path / "plain")
    compressed = commbench("simulate", *slow, "--np", "16", "--dist-optimizer", "allreduce",
                           "--compression", "powersgd:4", "-o", tmp_path / "psgd")
    assert plain.returncode == compressed.returncode == 0, compressed.stderr

    def row(directory):
        doc = json.loads(next(directory.glob("*.json")).read_text())
        return next(r for r in doc["rows"] if r["workers"] == 16)

    assert row(tmp_path / "psgd")["img_sec"] > 3 * row(tmp_path / "plain")["img_sec"]
    # the first steps, before PowerSGD starts, are the plain allreduce's
    assert row(tmp_path / "psgd")["first_steps"] == {
        "steps": 2, "img_sec": pytest.approx(row(tmp_path / "plain")["img_sec"])}
    assert row(tmp_path / "plain")["first_steps"] is None
    text = " ".join(compressed.stdout.split())
    assert "allreduce (powersgd:4): torch's PowerSGD hook's bytes" in text
    assert "codec not measured by any run given: none counted" in text
    assert "Its first 2 steps send the gradients whole" in text
    later = commbench("simulate", *slow, "--np", "16", "--dist-optimizer", "allreduce",
                      "--compression", "powersgd:4,start=10", "-o", tmp_path / "later")
    assert later.returncode == 0, later.stderr
    assert row(tmp_path / "later")["strategy"] == "allreduce (powersgd:4,start=10)"
    assert row(tmp_path / "later")["first_steps"]["steps"] == 10
    bad = commbench("simulate", *STATED, "--compression", "powersgd:0", "-o", tmp_path / "b")
    assert bad.returncode == 2 and "argument --compression" in bad.stderr


def test_fp16_and_bf16_runs_are_strategies_of_their_own_sending_half_the_bytes():
    from commbench.simulate.calibrate import strategy_of
    from commbench.simulate.costs import Layout
    from commbench.simulate.step import simulate
    from commbench.simulate.strategy import Strategy
    from test_simulate_engines import NET
    from commbench.simulate import compute

    def run(name, **config):
        return strategy_of({"config": {"dist_optimizer": name, **config}})

    assert run("allreduce", compression="bf16") == Strategy("allreduce", narrow="bf16")
    assert run("allreduce", compression="bf16").label() == "allreduce (bf16)"
    assert run("neighbor_allreduce", fp16_allreduce=True).label() == \
        "neighbor_allreduce (exponential-2, dynamic, fp16)"
    assert run("allreduce").label() == "allreduce"
    grads = compute.gradients("resnet18", 32)
    work = compute.stated(300.0, 32, grads.forward_share, "stated")

    def sent(strategy):  # seconds on the wire, overlapped or not
        step = simulate(strategy, Layout(16, 8), work, grads, NET, False, ("ring",))
        return step.exposed + step.overlapped

    for name in ("allreduce", "neighbor_allreduce"):
        assert sent(Strategy(name, narrow="bf16")) == pytest.approx(
            sent(Strategy(name)) / 2, rel=0.05)
