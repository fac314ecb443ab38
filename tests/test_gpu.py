"""On GPUs, for real: every strategy and the microbench through torchrun and mpiexec
on 2 GPUs (NCCL); on one GPU, every path a single rank takes (NCCL, AMP, the timeline's
kernels, training to accuracy) and two ranks refused a shared GPU. Skipped, saying why,
where too few GPUs are visible; a user or a CI runner with GPUs proves the GPU paths
with `python -m pytest -m gpu`."""

import json
import re

import pytest
import torch

from launchers import TINY_RUN, mpiexec, torchrun
from test_local_data import image_folder

GPUS = torch.cuda.device_count()
pytestmark = [pytest.mark.gpu, pytest.mark.mpi]
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a GPU, this machine has none")
two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 GPUs, this machine has {GPUS}")

STRATEGIES = ["allreduce", "gradient_allreduce", "neighbor_allreduce",
              "hierarchical_neighbor_allreduce", "none"]


def start(launcher, n, args, tmp_path, timeout=240):
    command = mpiexec if launcher == "mpiexec" else torchrun
    return command(n, ["-m", "commbench", *args, "--results-dir", str(tmp_path)],
                   timeout=timeout)


def launch(launcher, args, tmp_path, n=2):
    done = start(launcher, n, args, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]


def on_the_gpu(doc, ranks=1):
    env = doc["environment"]
    assert env["device"] == "cuda" and env["backend"] == "nccl"
    assert len(env["gpus"]) == ranks and all(env["gpus"]) and env["cudnn_benchmark"] is True


def split_adds_up(doc, ranks):
    split, wall = doc["samples"]["step_split"], doc["samples"]["batch_seconds"]
    assert split is not None, "the kernels' times did not lie in their steps"
    for rank in range(ranks):
        batches = [b for iteration in wall[rank] for b in iteration]
        for (step, compute, _, exposed, waiting, other, _), measured in zip(split[rank],
                                                                             batches):
            assert abs(compute + exposed + waiting + other - measured) <= 0.02 * measured
            assert compute > 0


# One GPU: a single rank on NCCL. hierarchical_neighbor_allreduce needs 2 machines.
@one_gpu
@pytest.mark.parametrize("launcher, strategy", [
    ("torchrun", "allreduce"), ("torchrun", "gradient_allreduce"),
    ("torchrun", "neighbor_allreduce"), ("torchrun", "none"), ("mpiexec", "allreduce"),
    ("mpiexec", "neighbor_allreduce")])
def test_every_strategy_runs_on_one_gpu(launcher, strategy, tmp_path):
    (doc,) = launch(launcher, [f"--dist-optimizer={strategy}", *TINY_RUN], tmp_path, n=1)
    on_the_gpu(doc)
    assert doc["summary"]["img_sec_per_worker"]["mean"] > 0


@one_gpu
@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_amp_runs_on_one_gpu(amp, tmp_path):
    (doc,) = launch("torchrun", ["--dist-optimizer=allreduce", "--amp", amp, *TINY_RUN],
                    tmp_path, n=1)
    on_the_gpu(doc)
    assert doc["config"]["amp"] == amp


@one_gpu
def test_a_timeline_on_one_gpu_holds_the_kernels_and_the_split_adds_up(tmp_path):
    trace_path = tmp_path / "trace.json"
    (doc,) = launch("mpiexec", ["--dist-optimizer=allreduce", *TINY_RUN,
                                "--timeline", str(trace_path)], tmp_path / "r", n=1)
    split_adds_up(doc, 1)
    trace = json.loads(trace_path.read_text())["traceEvents"]
    assert "kernel" in {e["cat"] for e in trace if e["ph"] == "X"}


@one_gpu
def test_a_language_model_on_one_gpu_trains_in_bf16_and_records_its_mfu(tmp_path):
    pytest.importorskip("transformers", reason="the language models need the lm extra")
    from commbench.job import peak_flops

    done = torchrun(1, ["-m", "commbench", "--dist-optimizer=allreduce", "--model", "lm-tiny",
                        "--seq-len", "64", "--batch-size", "8", "--num-iters", "3",
                        "--results-dir", str(tmp_path)], timeout=240,
                    env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    on_the_gpu(doc)
    summary = doc["summary"]
    assert doc["config"]["amp"] == ("bf16" if torch.cuda.is_bf16_supported() else "off")
    peak = peak_flops.peak(torch.cuda.get_device_name(0))
    if peak is None:  # a GPU without a datasheet peak here: said, not guessed
        assert summary["mfu"] is None and "MFU: not known" in done.stdout
    else:
        assert summary["mfu"] == pytest.approx(summary["flops_per_token"] * summary[
            "img_sec_per_worker"]["mean"] / peak) and 0 < summary["mfu"] < 1
        assert re.search(r"MFU: [\d.]+% of the GPU's dense bf16 peak", done.stdout)


@one_gpu
def test_training_to_accuracy_on_one_gpu_evaluates_on_the_gpu(tmp_path):
    (doc,) = launch("torchrun", ["--dist-optimizer=neighbor_allreduce", "--model", "resnet18",
                                 "--image-size", "32", "--batch-size", "32",
                                 "--data", "learnable:samples=320,noise=2",
                                 "--reference-iters", "0", "--target-accuracy", "1",
                                 "--eval-every", "3", "--max-epochs", "0.6"], tmp_path, n=1)
    on_the_gpu(doc)
    assert doc["kind"] == "accuracy" and [p["step"] for p in doc["curve"]] == [3, 6]
    assert all(0 <= p["accuracy"] <= 1 and p["loss"] > 0 for p in doc["curve"])


@one_gpu
def test_an_image_folder_is_loaded_by_worker_processes_onto_one_gpu(tmp_path):
    root = image_folder(tmp_path / "colours", 32, 8)
    (doc,) = launch("mpiexec", ["--dist-optimizer=allreduce", "--model", "resnet18",
                                "--image-size", "16", "--batch-size", "8",
                                "--reference-iters", "0", "--data", f"imagefolder:{root}",
                                "--target-accuracy", "0.9", "--eval-every", "2",
                                "--max-epochs", "4"], tmp_path / "r", n=1)
    on_the_gpu(doc)
    assert doc["data"]["steps_per_epoch"] == 64 // 8 and doc["summary"]["reached"] is True


@one_gpu
@pytest.mark.skipif(GPUS != 1, reason=f"needs exactly one GPU, this machine has {GPUS}")
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_two_ranks_on_one_gpu_are_refused_in_one_line_each(launcher, tmp_path):
    done = start(launcher, 2, ["--dist-optimizer=allreduce", *TINY_RUN], tmp_path, timeout=120)
    assert done.returncode != 0
    said = re.findall(r"^.*runs 2 ranks but they have only 1 GPU\(s\) between them.*$",
                      done.stderr, re.MULTILINE)
    assert len(said) == 2, done.stderr[-3000:]
    # (torchrun itself ends with the traceback of its ChildFailedError)
    assert done.stderr.count("Traceback") == done.stderr.count("ChildFailedError:")
    assert not list(tmp_path.glob("*.json"))


# Two GPUs: every strategy between ranks, on NCCL.
@two_gpus


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_runs_on_two_gpus(launcher, strategy, tmp_path):
    flags = ["--machine-size", "1"] if strategy.startswith("hierarchical") else []
    (doc,) = launch(launcher, [f"--dist-optimizer={strategy}", *TINY_RUN, *flags], tmp_path)
    on_the_gpu(doc, ranks=2)
    if strategy == "allreduce":
        assert doc["summary"]["parameters_identical"] is True


@two_gpus
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_amp_fp16_runs_on_two_gpus(launcher, tmp_path):
    (doc,) = launch(launcher, ["--dist-optimizer=allreduce", "--amp", "fp16", *TINY_RUN],
                    tmp_path)
    assert doc["config"]["amp"] == "fp16"


@two_gpus
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_microbench_on_two_gpus_is_right_and_synchronised(launcher, tmp_path):
    (doc,) = launch(launcher, ["microbench", "--op",
                               "allreduce,neighbor_allreduce,hierarchical_neighbor_allreduce",
                               "--machine-size", "1", "-b", "1M", "-e", "16M", "-f", "16",
                               "-n", "5", "-w", "2"], tmp_path)
    assert doc["summary"]["wrong"] == 0
    raw = {row["impl"] for row in doc["rows"]}
    assert "nccl send/recv" in raw and not any(impl.startswith("gloo") for impl in raw)


@two_gpus
@pytest.mark.parametrize("strategy", ["allreduce", "neighbor_allreduce"])
def test_a_timeline_on_gpus_holds_the_kernels_and_the_split_adds_up(strategy, tmp_path):
    trace_path = tmp_path / "trace.json"
    (doc,) = launch("mpiexec", [f"--dist-optimizer={strategy}", *TINY_RUN,
                                "--timeline", str(trace_path)], tmp_path / "r")
    split_adds_up(doc, 2)
    trace = json.loads(trace_path.read_text())["traceEvents"]
    kinds = {e["cat"] for e in trace if e["ph"] == "X"}
    assert {"kernel", "nccl"} <= kinds
