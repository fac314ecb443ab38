"""The tools beyond training on a language model (issue 55, part 6): `compare` and
`simulate` in tokens/sec, simulate's gradient layout of a named size and what it refuses
to project, microbench at a model's message sizes (--sizes-of), and the timeline and
step split of an lm-tiny run through mpiexec."""

import json

import pytest

from cli_helpers import commbench, refused
from launchers import mpiexec, only_result
from test_language_models import LM_RUNS, TINY_LM, needs_transformers
from test_spans import check_trace

pytest.importorskip("torch.utils.flop_counter", reason="commbench simulate needs torch >= 2.1")

PARAMETERS = 3487232  # lm-tiny's, as its runs record them (summary.parameters)


def test_compare_says_tokens_per_sec_for_a_language_model():
    done = commbench("compare", LM_RUNS, LM_RUNS)
    assert done.returncode == 0, done.stderr
    assert "per-iteration total tokens/sec (S_i)" in done.stdout
    assert "lm-tiny, batch 2 per worker, sequences of 32 tokens, fp32, cpu, gloo" in done.stdout
    header = next(line for line in done.stdout.splitlines() if line.startswith("strategy"))
    assert "base tokens/sec" in header and "new tokens/sec" in header
    assert "img/sec" not in done.stdout and "images" not in done.stdout
    pair = json.loads(commbench("compare", LM_RUNS, LM_RUNS, "--format", "json").stdout)
    assert pair["test"].startswith("Welch's t-test on per-iteration total tokens/sec")
    assert [p["base"]["unit"] for p in pair["pairs"]] == ["tokens", "tokens"]


def test_simulate_projects_a_language_model_in_tokens_per_sec(tmp_path):
    needs_transformers()
    done = commbench("simulate", LM_RUNS, "--np", "1,2,4", "--link", "10gbit",
                     "-o", tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("PROJECTION: lm-tiny, batch 2 per worker, sequences of 32 tokens, ")
    headers = [line for line in out.splitlines() if line.startswith(("N ", "strategy "))]
    assert "tokens/sec" in headers[0] and "tokens/sec" in headers[1]
    assert "img/sec" not in out
    # the bytes: every fp32 parameter the run recorded, once (13.9 MB)
    assert f"gradients {4 * PARAMETERS / 1e6:.1f} MB" in out
    rows = {(line.split()[0], line.split()[1]): line
            for line in out.split("Step split")[0].splitlines() if line.startswith("allreduce ")}
    assert "measured" in rows[("allreduce", "2")] and "extrapolated" in rows[("allreduce", "4")]
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["inputs"]["gradient_bytes"] == 4 * PARAMETERS
    assert (doc["workload"]["unit"], doc["workload"]["image_size"]) == ("tokens", 32)
    # the projection file, read back by report, keeps its unit
    shown = commbench("report", tmp_path)
    assert shown.returncode == 0 and "tokens/sec" in shown.stdout, shown.stderr


def test_a_language_models_gradients_are_its_parameters_embeddings_last():
    needs_transformers()
    from commbench.job import language_models
    from commbench.simulate import language

    grads = language.language_gradients("lm-tiny", 128)
    counts = language_models.parameter_counts(language_models.build("lm-tiny", "meta"))
    assert grads.total == 4 * counts["parameters"] == 4 * PARAMETERS
    assert list(grads.ready) == sorted(grads.ready) and grads.ready[0] > 0
    # the token table (shared with the output layer) and the positions come last
    assert sorted(grads.shapes[-2:]) == [(256, 256), (1024, 256)]
    assert grads.ready[-1] == 1.0 and grads.forward_share == pytest.approx(1 / 3)
    # DDP's first bucket is small: what microbench --sizes-of measures
    assert [nbytes for nbytes, _ in grads.buckets()] == [1051648, 12897280]


@pytest.mark.parametrize("args, message", [
    (["--model", "lm-tiny", "--link", "1gbit"],
     "cannot project lm-tiny: no run of it with sequences of 128 tokens under PATH to take its "
     "compute from; calibrate with `commbench run --model lm-tiny --seq-len 128` and pass its "
     "result file"),
    ([LM_RUNS, "--model", "lm-tiny", "--batch-size", "4", "--link", "1gbit"],
     "cannot project lm-tiny: no run of it at batch 4 with sequences of 128 tokens under PATH "
     "to take its compute from; calibrate with `commbench run --model lm-tiny --seq-len 128` "
     "and pass its result file"),
    (["--model", "lm-tiny", "--img-sec", "900", "--link", "1gbit"],
     "argument --img-sec: lm-tiny is a language model: its compute comes from a calibration "
     "run of it (commbench run --model lm-tiny), not from a stated speed"),
    ([LM_RUNS, "--model", "lm-tiny", "--image-size", "32", "--link", "1gbit"],
     "argument --image-size: lm-tiny is a language model: it reads tokens; give --seq-len"),
    ([LM_RUNS, "--model", "lm-tiny", "--seq-len", "2048", "--link", "1gbit"],
     "argument --seq-len: lm-tiny takes at most 1024 tokens, not 2048"),
    (["--model", "resnet18", "--seq-len", "32", "--img-sec", "100", "--link", "1gbit"],
     "argument --seq-len: resnet18 is an image model: give --image-size"),
])
def test_what_simulate_cannot_project_for_a_language_model_is_one_line(tmp_path, args,
                                                                        message):
    assert refused("simulate", *args, "-o", tmp_path) == f"commbench: error: {message}"


@pytest.mark.parametrize("args, message", [
    (["--sizes-of", "lm-tiny", "-e", "1M"],
     "argument -e/--maxbytes: --sizes-of lm-tiny gives the sizes; leave it out"),
    (["--sizes-of", "lm-tiny", "-f", "4"],
     "argument -f/--stepfactor: --sizes-of lm-tiny gives the sizes; leave it out"),
    (["--sizes-of", "lm-huge"],
     "argument --sizes-of: unknown model 'lm-huge'; `commbench list` shows the models"),
])
def test_microbench_sizes_of_a_model_refuses_what_it_replaces(args, message):
    assert refused("microbench", *args) == f"commbench: error: {message}"


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_microbench_at_a_language_models_message_sizes(tmp_path):
    needs_transformers()
    done = mpiexec(2, ["-m", "commbench", "microbench", "--sizes-of", "lm-tiny", "--op",
                       "allreduce", "-n", "2", "-w", "1", "--no-raw", "--results-dir",
                       str(tmp_path)], timeout=240, env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    # DDP's two buckets of lm-tiny, then its whole parameter buffer
    assert doc["summary"]["sizes"] == [1051648, 12897280, 4 * PARAMETERS]
    assert doc["config"]["sizes_of"] == "lm-tiny" and doc["summary"]["wrong"] == 0
    assert done.stdout.count("# sizes: lm-tiny's messages") == 1


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_timeline_and_step_split_of_a_language_model(tmp_path):
    needs_transformers()
    trace_path = tmp_path / "trace.json"
    done = mpiexec(2, ["-m", "commbench", "--dist-optimizer=allreduce", *TINY_LM,
                       "--timeline", str(trace_path), "--results-dir", str(tmp_path / "r")],
                   timeout=240, env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Timeline: {trace_path}" in done.stdout
    assert "Step split (mean per step):" in done.stdout
    spans = check_trace(json.loads(trace_path.read_text())["traceEvents"], 2)
    kinds = {(e["pid"], e["cat"]) for e in spans}
    for rank in (0, 1):
        assert {(rank, k) for k in ("step", "forward", "backward", "optimizer", "comm")} <= kinds
    steps = 3 * 2  # --num-iters x --num-batches-per-iter
    assert len([e for e in spans if e["cat"] == "step"]) == 2 * steps
    assert all(e["args"]["bytes"] > 0 for e in spans if e["cat"] == "comm")
    doc = only_result(tmp_path / "r")
    split, wall = doc["samples"]["step_split"], doc["samples"]["batch_seconds"]
    for rank in (0, 1):
        batches = [b for iteration in wall[rank] for b in iteration]
        assert len(split[rank]) == len(batches) == steps
        for (_, compute, _, exposed, waiting, other, codec, _), measured in zip(split[rank],
                                                                               batches):
            assert abs(compute + exposed + waiting + other + codec - measured) <= 0.02 * measured
            assert compute > 0
    assert set(doc["summary"]["step_split"]) == {"step", "compute", "overlapped", "exposed",
                                                 "waiting", "other", "codec", "injected"}
    assert doc["summary"]["unit"] == "tokens"
