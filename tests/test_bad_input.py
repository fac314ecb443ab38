"""Bad input, every kind, gets one line naming the flag and what it accepts, exit 2,
no traceback; on every rank under a launcher, before any communication."""

import json
import os
import re
import shutil

import pytest

from cli_helpers import commbench, refused
from commbench.result import store
from commbench.config import flags
from commbench.cli import main
from commbench.config.run_config import RunConfig
from commbench.errors import UsageError
from launchers import TINY_RUN, mpiexec

NUMBERS = (flags.positive_int, flags.non_negative_int, flags.positive_float, flags.fraction,
           flags.non_negative_float)
NUMERIC_FLAGS = [f for f in flags.flag_fields(RunConfig) if f.metadata["type"] in NUMBERS]


@pytest.mark.parametrize("field", NUMERIC_FLAGS, ids=lambda f: f.name)
@pytest.mark.parametrize("value", ["-1", "zero", ""])
def test_every_numeric_flag_rejects_bad_values_in_one_line(field, value, capsys):
    flag = "--" + field.name.replace("_", "-")
    accepted = field.metadata["type"].accepts
    with pytest.raises(SystemExit) as exit_:
        main(["run", f"{flag}={value}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and f"argument {flag}: must be {accepted}" in err


@pytest.mark.parametrize("field", [f for f in flags.flag_fields(RunConfig)
                                   if f.metadata["type"] in (flags.positive_float,
                                                             flags.non_negative_float,
                                                             flags.fraction)],
                         ids=lambda f: f.name)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "1e999"])
def test_every_float_flag_refuses_what_is_not_finite(field, value, capsys):
    flag = "--" + field.name.replace("_", "-")
    with pytest.raises(SystemExit) as exit_:
        main(["run", f"{flag}={value}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert f"argument {flag}: must be {field.metadata['type'].accepts}, got {value!r}" in err


@pytest.mark.parametrize("field", [f for f in NUMERIC_FLAGS
                                   if f.metadata["type"].__name__.startswith("positive")],
                         ids=lambda f: f.name)
def test_zero_is_refused_where_a_positive_value_is_needed(field, capsys):
    flag = "--" + field.name.replace("_", "-")
    with pytest.raises(SystemExit):
        main(["run", flag, "0"])
    assert f"argument {flag}: must be a positive" in capsys.readouterr().err


@pytest.mark.mpi
@pytest.mark.parametrize("args, message", [
    (["--model", "inception_v3", "--image-size", "32"],
     "argument --image-size: 32 is too small for inception_v3"),
    (["--dist-optimizer", "neighbor_allreduce", "--topology", "hypercube"],
     "argument --topology: unknown topology 'hypercube'"),
    (["--dist-optimizer", "neighbor_allreduce", "--topology", "star"],
     "argument --topology: topology 'star' has no dynamic schedule"),
    (["--slow-ranks", "1,2:2"], "argument --slow-ranks: rank 2 does not exist; this job has "
     "ranks 0 to 1"),
    (["--batch-size", "1", "--image-size", "1"], "argument --batch-size: resnet18 cannot "
     "train on a batch of 1 image of 1 px: its BatchNorm layer bn1 would get one value per "
     "channel (1x1 px per image)"),
])
def test_impossible_requests_fail_on_every_rank_under_mpiexec(args, message, tmp_path):
    done = mpiexec(2, ["-m", "commbench", *TINY_RUN, *args, "--results-dir", str(tmp_path)],
                   timeout=120)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("commbench: error:")]
    assert errors and all(message in e for e in errors), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.json"))


def test_a_full_results_directory_is_refused_at_start_up(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(store.shutil, "disk_usage",
                        lambda path: usage._replace(free=1024 * 1024))
    with pytest.raises(UsageError, match="--results-dir: .* has only 1024 KiB free"):
        store.ensure_writable(tmp_path)


def test_an_unwritable_results_path_is_refused_before_the_benchmark(tmp_path):
    # Works as root too: nobody can create a directory beneath a regular file.
    (tmp_path / "file").write_text("")
    done = commbench(*TINY_RUN, "--results-dir", str(tmp_path / "file" / "r"))
    assert done.returncode == 2 and "--results-dir: cannot write" in done.stderr
    assert "Model:" not in done.stdout and "Traceback" not in done.stderr


def test_a_huge_file_is_skipped_without_being_read(tmp_path):
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(store.MAX_RESULT_BYTES + 1)  # sparse: costs no disk
    found, warnings = store.load_results([tmp_path])
    assert found == [] and "too large" in warnings[0]


def test_names_inside_a_result_never_leave_the_output_directory(tmp_path):
    from commbench.analysis.plot_command import plot

    runs = os.path.join(os.path.dirname(__file__), "data", "runs")
    doc = json.loads(open(os.path.join(runs, sorted(os.listdir(runs))[0])).read())
    doc["config"]["model"] = "../../../escaped/evil"
    doc["environment"]["cpu"] = "/etc/passwd"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "evil.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert plot([tmp_path / "in"], out) == 0
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".png"]
    assert written and all(p.parent == out for p in written)
    assert not (tmp_path.parent / "escaped").exists()


@pytest.mark.parametrize("args, value", [
    (("--target-accuracy", "-inf"), "-inf"),
    (("run", "--batch-size", "-3"), "-3"),
    (("simulate", "--link", "10gbit", "--latency", "-1us"), "-1us"),
    (("microbench", "-b", "-7"), "-7"),
    (("sweep", "--dry-run", "--np", "1", "--num-iters", "-2.5e1"), "-2.5e1"),
])
def test_a_value_that_starts_with_a_minus_reaches_its_check_and_is_repeated(args, value):
    # argparse takes "-inf" or "-1us" after a space for a flag, and would answer
    # "expected one argument" although one was given.
    line = refused(*args)
    assert "expected one argument" not in line and repr(value) in line, line


@pytest.mark.parametrize("batch, side, layer", [(1, 1, "bn1"), (1, 32, "layer4.0.bn1"),
                                                (2, 1, None), (1, 64, None)])
def test_a_batch_that_leaves_batchnorm_one_value_per_channel_is_refused(batch, side, layer):
    import torch

    from commbench.job.models import build_model, check_input

    model = build_model("resnet18", 10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    images = torch.zeros(batch, 3, side, side)
    if layer is None:
        check_input(model, images, "resnet18", side, batch)
    else:
        with pytest.raises(UsageError, match=rf"--batch-size: resnet18 cannot train on a "
                           rf"batch of 1 image of {side} px: its BatchNorm layer "
                           rf"{re.escape(layer)} would get one value per channel"):
            check_input(model, images, "resnet18", side, batch)
    # the check leaves the model as it was: in training mode, its statistics untouched
    assert model.training and all(torch.equal(v, before[k])
                                  for k, v in model.state_dict().items())
