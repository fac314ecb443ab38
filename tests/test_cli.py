"""The command line: flag set snapshot, default subcommand, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import commbench
from commbench.cli import build_parser
from commbench.config.run_config import RunConfig, config_from_args

REPO = Path(__file__).resolve().parents[1]

# The run flags, snapshotted: a change here is a change users see. Update it on purpose.
RUN_FLAGS = [
    "--amp", "--atc-style", "--augment", "--average-every", "--batch-size",
    "--checkpoint-dir", "--checkpoint-every", "--compression",
    "--cpu-transport",
    "--data",
    "--disable-dynamic-topology", "--dist-optimizer", "--eval-every", "--fail",
    "--fp16-allreduce", "--hierarchical-allreduce", "--image-size", "--independent-init",
    "--local-warmup-steps", "--lr", "--machine-size", "--max-epochs", "--model", "--momentum",
    "--no-broadcast-buffers", "--no-cuda", "--num-batches-per-iter", "--num-classes",
    "--num-iters", "--num-warmup-batches", "--outer-dtype", "--outer-lr", "--outer-momentum",
    "--partition", "--recovery", "--reference-iters",
    "--reference-seconds",
    "--results-dir", "--seed", "--seq-len", "--slow-ranks", "--tag", "--target-accuracy",
    "--target-loss", "--time-budget",
    "--timeline",
    "--timeline-steps", "--timeout", "--topology", "--use-adasum", "--warmup-epochs",
    "--weight-decay",
]


def run_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["run"]


def test_run_flags_do_not_drift():
    flags = sorted(o for a in run_parser()._actions for o in a.option_strings
                   if o.startswith("--") and o != "--help")
    assert flags == RUN_FLAGS


def test_defaults_follow_horovod_and_bluefog_benchmarks():
    config = config_from_args(build_parser().parse_args(["run"]))
    assert config.options == {"use_adasum": False, "hierarchical_allreduce": False,
                              "no_broadcast_buffers": False, "average_every": 8,
                              "local_warmup_steps": 0, "outer_lr": 0.7,
                              "outer_momentum": 0.9, "outer_dtype": "fp32"}
    assert config == RunConfig(options=config.options)
    assert (config.model, config.batch_size, config.num_warmup_batches,
            config.num_batches_per_iter, config.num_iters) == ("resnet50", 32, 10, 10, 10)
    assert (config.topology, config.results_dir, config.image_size) == (
        "exponential-2", "results", 224)


def test_a_result_records_the_same_config_keys_as_before_plugins_had_flags():
    fixture = next((REPO / "tests" / "data" / "runs").glob("*-allreduce-n2-*.json"))
    recorded = json.loads(fixture.read_text())["config"]
    config = config_from_args(build_parser().parse_args(["run"]))
    added_since = {"amp", "reference_seconds", "timeline", "timeline_steps", "data",
                   "partition", "target_accuracy", "eval_every", "time_budget", "max_epochs",
                   "weight_decay", "warmup_epochs", "no_broadcast_buffers", "average_every",
                   "local_warmup_steps", "outer_lr", "outer_momentum", "outer_dtype",
                   "augment", "compression", "slow_ranks", "seq_len", "fail",
                   "target_loss", "recovery", "checkpoint_every", "checkpoint_dir"}
    assert set(config.to_dict()) - set(recorded) == added_since
    assert set(recorded) <= set(config.to_dict())


def test_plugin_flags_reach_the_plugin():
    from commbench.optimizers.horovod import Horovod

    config = config_from_args(build_parser().parse_args(["run", "--use-adasum"]))
    assert config.to_dict()["use_adasum"] is True
    assert Horovod.options_of(config).use_adasum is True
    assert Horovod.options_of(RunConfig()).use_adasum is False


def test_flags_reach_the_config():
    args = build_parser().parse_args(["run", "--batch-size", "8", "--atc-style",
                                      "--machine-size", "2", "--dist-optimizer=none"])
    config = config_from_args(args)
    assert (config.batch_size, config.atc_style, config.machine_size,
            config.dist_optimizer) == (8, True, 2, "none")


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "argument --batch-size: must be a positive integer, got '0'"),
    (["--num-iters", "-3"], "argument --num-iters: must be a positive integer, got '-3'"),
    (["--num-warmup-batches", "x"], "argument --num-warmup-batches: must be an integer >= 0"),
    (["--lr", "nan"], "argument --lr: must be a finite number >= 0"),
    (["--timeout", "0"], "argument --timeout: must be a positive, finite number"),
    (["--timeout", "inf"], "argument --timeout: must be a positive, finite number"),
    (["--timeout", "nan"], "argument --timeout: must be a positive, finite number"),
    (["--amp", "fp8"], "argument --amp: must be one of auto, off, fp16, bf16"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--dist-optimizer", "nope"], "argument --dist-optimizer: unknown strategy 'nope'"),
    (["--model", "resnet9000"], "argument --model: unknown model 'resnet9000'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    done = commbench(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_no_subcommand_means_run_and_help_lists_subcommands():
    done = commbench("--help")
    assert done.returncode == 0 and "run" in done.stdout and "list" in done.stdout
    done = commbench("--dist-optimizer", "nope")  # reached `run`, which rejected the name
    assert "unknown strategy" in done.stderr


def test_list_shows_strategies_and_why_not():
    done = commbench("list")
    assert done.returncode == 0
    assert "allreduce" in done.stdout and "none" in done.stdout and "usable" in done.stdout


@pytest.mark.job
def test_the_command_as_a_process_lists_and_refuses():
    """The smoke test of `python -m commbench` itself: the program starts, lists, and a
    refused flag is one line with exit 2 (the checks above call it in-process)."""
    def commbench_process(*args):
        return subprocess.run([sys.executable, "-m", "commbench", *args], capture_output=True,
                              text=True, timeout=120)

    done = commbench_process("list")
    assert done.returncode == 0 and "usable" in done.stdout, done.stderr
    done = commbench_process("--batch-size", "0")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("commbench run: error: argument --batch-size: must be a positive "
                           "integer, got '0' (see --help)\n")


def test_a_plugin_whose_flag_clashes_with_run_is_one_line(monkeypatch, capsys):
    from dataclasses import dataclass

    from commbench import registry
    from commbench.cli import main
    from commbench.config.flags import flag
    from commbench.optimizers.base import Strategy

    @dataclass(frozen=True)
    class Clashing:
        model: str = flag("x", "a flag run already has")

    class Plugin(Strategy):
        name, summary, Options = "clashing", "declares --model", Clashing

    monkeypatch.setattr(registry, "loadable", lambda: {"clashing": Plugin})
    with pytest.raises(SystemExit) as exit_:
        main(["list"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("commbench: error: plugin 'clashing' declares --model, "
                                       "which is a flag of commbench run\n")


@pytest.mark.parametrize("args", [
    ("plot", "tests/data/runs", "-o", "/proc/charts"),
    ("report", "tests/data/runs", "-o", "/proc/report.txt"),
])
def test_a_command_with_no_ranks_names_the_path_and_the_reason_and_no_rank(args):
    done = commbench(*args, cwd=Path(__file__).resolve().parents[1])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1
    assert lines[-1] == f"commbench: error: {args[-1]}: No such file or directory"
    assert "rank" not in done.stderr
