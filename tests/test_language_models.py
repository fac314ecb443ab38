"""The language models by name (commbench.job.language_models): the named sizes, their
parameter counts against the published ones, FLOPs per token, nothing downloaded,
`commbench list` with and without transformers, the flags refused with them, a speed run
on synthetic tokens (the shared training step, tokens/sec, the result's unit) through
mpiexec, and the readers' unit."""

import json
import math
import socket
import sys
from pathlib import Path
from unittest import mock

import pytest

from cli_helpers import commbench
from commbench.analysis import reader
from commbench.data import batches
from commbench.job import language_models
from commbench.job.language_models import LANGUAGE_MODELS, flops_per_token
from launchers import mpiexec, only_result

LM_RUNS = Path(__file__).parent / "data" / "lm"  # tests/data/make_fixtures.sh
TINY_LM = ["--model", "lm-tiny", "--seq-len", "32", "--batch-size", "2",
           "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "3",
           "--reference-iters", "1", "--reference-seconds", "0"]


def needs_transformers():
    return pytest.importorskip("transformers", reason="the language models need "
                               "transformers (not installed here, e.g. the Bluefog "
                               "environment's torch 1.10)")


def test_the_named_sizes():
    assert list(LANGUAGE_MODELS) == ["lm-tiny", "gpt2-small", "llama-1b"]
    tiny = LANGUAGE_MODELS["lm-tiny"]
    assert (tiny.family, tiny.layers, tiny.d_model, tiny.vocab, tiny.seq_len) == (
        "gpt2", 4, 256, 256, 128)
    assert [LANGUAGE_MODELS[n].seq_len for n in LANGUAGE_MODELS] == [128, 1024, 2048]
    assert all(spec.seq_len <= spec.context for spec in LANGUAGE_MODELS.values())


@pytest.mark.parametrize("name, parameters, non_embedding", [
    # GPT-2 124M as released (Hugging Face's `gpt2`): 124,439,808; nanoGPT's N leaves out
    # the 1024 x 768 position table.
    ("gpt2-small", 124_439_808, 124_439_808 - 1024 * 768),
    # Llama 3.2 1B, tied embeddings: 1,235,814,400; RoPE has no table to leave out.
    ("llama-1b", 1_235_814_400, 1_235_814_400),
])
def test_parameter_counts_are_the_published_ones(name, parameters, non_embedding):
    needs_transformers()
    counts = language_models.parameter_counts(language_models.build(name, "meta"))
    assert counts == {"parameters": parameters, "non_embedding": non_embedding}


def test_lm_tiny_is_a_few_million_parameters_built_without_the_network(monkeypatch):
    needs_transformers()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise AssertionError(f"building a model reached for the network: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    model = language_models.build("lm-tiny")
    counts = language_models.parameter_counts(model)
    # 4 blocks of 12 x 256^2 weights and their biases and norms, the final norm, a
    # token table of 256 x 256 (tied with the output layer) and positions 1024 x 256.
    blocks = 4 * (12 * 256 * 256 + 13 * 256)
    assert counts == {"parameters": blocks + 2 * 256 + 256 * 256 + 1024 * 256,
                      "non_embedding": blocks + 2 * 256 + 256 * 256}
    assert 2e6 < counts["parameters"] < 5e6
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_flops_per_token_is_6n_plus_attention():
    # lm-tiny at 128 tokens: 6N + 12 x 4 layers x 256 wide x 128.
    assert flops_per_token("lm-tiny", 1000, 128) == 6000 + 12 * 4 * 256 * 128
    # gpt2-small at 1024 tokens, as nanoGPT's MFU counts it (its N, its attention term).
    n = 124_439_808 - 1024 * 768
    assert flops_per_token("gpt2-small", n, 1024) == 6 * n + 12 * 12 * 768 * 1024


def test_mfu_is_the_model_flops_over_the_datasheet_peak_of_a_gpu_it_knows():
    from commbench.job import peak_flops
    from commbench.job.console import mfu_words

    assert peak_flops.peak("NVIDIA H100 80GB HBM3") == 989e12  # SXM
    assert peak_flops.peak("NVIDIA H100 PCIe") == 756e12
    assert peak_flops.peak("NVIDIA H200 NVL") == 835e12 and peak_flops.peak("NVIDIA H200") == 989e12
    assert peak_flops.peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops.peak("NVIDIA L40") == 181e12  # not the L4's, nor the L40S's
    assert peak_flops.peak("NVIDIA RTX A1000") is None  # not an A100
    assert peak_flops.peak("Tesla T4") is None and peak_flops.peak(None) is None
    # gpt2-small's 6N + attention at 1024 tokens, 100k tokens/sec on each of two H100s
    assert peak_flops.mfu(8.5e8, 1e5, ["NVIDIA H100 80GB HBM3"] * 2) == pytest.approx(
        8.5e13 / 989e12)
    # a rank on a GPU without a known peak, or two peaks in one job: none
    assert peak_flops.mfu(8.5e8, 1e5, ["NVIDIA H100 80GB HBM3", "Tesla T4"]) is None
    assert peak_flops.mfu(8.5e8, 1e5, ["NVIDIA H100 PCIe", "NVIDIA H100 NVL"]) is None
    assert peak_flops.mfu(8.5e8, 1e5, [None]) is None  # a CPU
    assert mfu_words(0.4123) == "MFU: 41.2% of the GPU's dense bf16 peak"
    assert "NOT TO BE TRUSTED" in mfu_words(1.3)
    assert mfu_words(None).startswith("MFU: not known")


def test_list_shows_each_language_model_with_its_parameters():
    needs_transformers()
    done = commbench("list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("Language models (--model):")
    shown = {line.split()[0]: line for line in lines[start + 1:start + 4]}
    assert "3.5M parameters" in shown["lm-tiny"]
    assert "124.4M parameters" in shown["gpt2-small"]
    assert "1235.8M parameters" in shown["llama-1b"]


def test_list_without_transformers_says_how_to_get_them():
    with mock.patch.dict(sys.modules, {"transformers": None}):  # import fails
        done = commbench("list")
    assert done.returncode == 0, done.stderr
    assert ("Language models (--model): lm-tiny, gpt2-small, llama-1b; NOT USABLE: the "
            "language models need `pip install transformers`") in done.stdout


def test_unknown_model_names_the_language_models_too():
    done = commbench("--model", "gpt9", "--no-cuda")
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1
    assert "unknown model 'gpt9'" in done.stderr
    assert "lm-tiny, gpt2-small, llama-1b" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", "lm-tiny", "--image-size", "64"],
     "argument --image-size: lm-tiny is a language model: it reads tokens (--seq-len), not "
     "images"),
    (["--model", "gpt2-small", "--num-classes", "10"],
     "argument --num-classes: gpt2-small is a language model"),
    (["--model", "resnet18", "--seq-len", "64"],
     "argument --seq-len: sets a language model's sequence length; resnet18 is an image model"),
    (["--model", "lm-tiny", "--seq-len", "1025"],
     "argument --seq-len: lm-tiny takes at most 1024 tokens, not 1025"),
    (["--model", "lm-tiny", "--data", "learnable"],
     "argument --data: lm-tiny trains on synthetic tokens, the generated language"),
])
def test_flags_that_change_nothing_are_refused_in_one_line(args, message):
    done = commbench(*args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr


def test_a_language_model_without_transformers_is_one_line():
    with mock.patch.dict(sys.modules, {"transformers": None}):
        done = commbench("--model", "lm-tiny", "--no-cuda")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert ("argument --model: lm-tiny is a language model: the language models need "
            "`pip install transformers`") in lines[0]


def test_synthetic_tokens_are_generated_once_with_next_token_labels():
    data = batches.synthetic_tokens(3, 16, 256, "cpu", seed=5)
    inputs, labels = data.next()
    assert inputs.shape == (3, 16) and labels.shape == (3 * 16,) and data.classes == 256
    assert (inputs[:, 1:] == labels.view(3, 16)[:, :-1]).all()  # each position's next
    again, _ = batches.synthetic_tokens(3, 16, 256, "cpu", seed=5).next()
    assert (again == inputs).all() and data.next()[0] is inputs  # from the seed, once


def test_the_shared_training_step_trains_a_language_model_on_tokens():
    needs_transformers()
    import torch

    from commbench.job.models import build_model
    from commbench.job.training_step import TrainingStep

    torch.manual_seed(0)
    model = build_model("lm-tiny", 256)
    step = TrainingStep(model, torch.optim.SGD(model.parameters(), lr=0.1))
    inputs, labels = batches.synthetic_tokens(2, 32, 256, "cpu", seed=1).next()
    first = step(inputs, labels).item()
    # Next-token cross-entropy of an untrained model over 256 tokens: about ln 256.
    assert abs(first - math.log(256)) < 0.5
    for _ in range(5):
        last = step(inputs, labels).item()
    assert last < first  # the same batch again: it learns


def test_report_and_plot_say_tokens_per_sec_for_a_language_model(tmp_path):
    done = commbench("report", LM_RUNS)
    assert done.returncode == 0, done.stderr
    assert "lm-tiny, batch 2 per worker, sequences of 32 tokens, fp32" in done.stdout
    header = next(line for line in done.stdout.splitlines() if line.startswith("strategy"))
    assert "total tokens/sec" in header and "img/sec" not in header
    assert "Total(1), each strategy's own 1-worker runs: allreduce" in done.stdout
    pytest.importorskip("matplotlib")
    from commbench.plots import scaling

    group = reader.analyse([LM_RUNS])[0][0]
    assert scaling.figure(group).axes[0].get_ylabel() == "total tokens/sec"


def total_tokens_per_sec(doc):
    """S_i from the raw samples: every rank's sequences x seq_len per iteration over its
    seconds, summed over the ranks."""
    config, seconds = doc["config"], doc["samples"]["iteration_seconds"]
    tokens = config["batch_size"] * config["num_batches_per_iter"] * config["seq_len"]
    return [sum(tokens / rank[i] for rank in seconds) for i in range(len(seconds[0]))]


def test_the_recorded_tokens_per_sec_are_sequences_times_seq_len_per_second():
    for path in sorted(LM_RUNS.glob("*.json")):
        doc = json.loads(path.read_text())
        summary, config = doc["summary"], doc["config"]
        assert (summary["unit"], config["seq_len"], summary["mfu"]) == ("tokens", 32, None)
        totals = total_tokens_per_sec(doc)
        assert summary["total_img_sec"]["mean"] == pytest.approx(sum(totals) / len(totals))
        run = reader.analyse([path])[0][0].points[0].runs[0]
        assert run.totals == pytest.approx(totals)  # read back in tokens too


# Every strategy on lm-tiny, and what it sends per communicating step against a plain
# fp32 exchange of every parameter (2 workers: a ring allreduce sends each rank the
# model's size once): None where the bound is below, not equal.
EVERY_STRATEGY = [
    (["allreduce"], 1.0),
    (["allreduce", "--compression", "bf16"], 0.5),
    # PowerSGD's first step is plain: it starts after the warm-up.
    (["allreduce", "--compression", "powersgd:2", "--num-warmup-batches", "2"], None),
    (["gradient_allreduce"], 1.0),
    (["neighbor_allreduce"], 1.0),
    (["hierarchical_neighbor_allreduce", "--machine-size", "1"], 1.0),
    (["local_sgd", "--average-every", "2"], 1.0),
    (["diloco", "--average-every", "2"], 1.0),
    (["horovod"], 1.0),
]


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy, share", EVERY_STRATEGY,
                         ids=[" ".join(flags) for flags, _ in EVERY_STRATEGY])
def test_mpiexec_speed_run_of_lm_tiny_records_tokens_per_sec(tmp_path, strategy, share):
    needs_transformers()
    if strategy[0] == "horovod":
        pytest.importorskip("horovod.torch", reason="Horovod is not installed here")
    done = mpiexec(2, ["-m", "commbench", f"--dist-optimizer={strategy[0]}",
                       "--results-dir", str(tmp_path), *TINY_LM, *strategy[1:]], timeout=240,
                   env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    summary = doc["summary"]
    assert doc["strategy"]["name"] == strategy[0] and summary["diverged"] is None
    assert all(math.isfinite(loss) for rank in doc["samples"]["loss"] for loss in rank)
    fp32_model = 4 * summary["parameters"]
    sent = summary["wire"]["bytes_per_communicating_step"]
    if share is None:
        assert 0 < sent < fp32_model / 10
    else:
        assert sent == pytest.approx(share * fp32_model, rel=1e-6)
    assert (summary["unit"], doc["config"]["seq_len"], summary["workers"]) == ("tokens", 32, 2)
    n = language_models.parameter_counts(language_models.build("lm-tiny", "meta"))
    assert summary["flops_per_token"] == 6 * n["non_embedding"] + 12 * 4 * 256 * 32
    assert summary["mfu"] is None and summary["parameters"] == n["parameters"]
    totals = total_tokens_per_sec(doc)  # 2 x 2 sequences of 32 tokens per iteration
    assert len(totals) == 3
    assert summary["total_img_sec"]["mean"] == pytest.approx(sum(totals) / 3)
    assert summary["img_sec_per_worker"]["mean"] == pytest.approx(sum(totals) / 6)
    assert done.stdout.count("Model: lm-tiny (sequences of 32 synthetic tokens)") == 1
    assert done.stdout.count(" tokens/sec per worker, loss ") == 3
    assert "Total tokens/sec on 2 worker(s)" in done.stdout
    assert "MFU: not known" in done.stdout and "img/sec" not in done.stdout
    # The language models' recipe, printed and recorded; fp32 on the CPU (--amp auto).
    recipe = doc["recipe"]
    assert (recipe["optimizer_name"], recipe["betas"], recipe["max_grad_norm"]) == (
        "AdamW", [0.9, 0.95], 1.0)
    assert (recipe["schedule"], doc["config"]["amp"]) == ("constant", "off")
    assert done.stdout.count("Recipe: AdamW, betas (0.9, 0.95)") == 1
