"""`commbench simulate`'s strategy flags under `commbench run`'s rules
(commbench.simulate.strategy_flags): a flag that would change no projected row, or a
setting `run` refuses for a strategy, is one line and exit 2, before any projection."""

import pytest

from cli_helpers import commbench, refused
from test_simulate import DATA, STATED

TWO_RUNS = [DATA / "runs" / "20261122T145415-resnet18-allreduce-n1-3d57beb9.json",
            DATA / "runs" / "20261122T145511-resnet18-neighbor_allreduce-exponential-2-n2-"
            "0f8d57d9.json"]


@pytest.mark.parametrize("argv, message", [
    (["--dist-optimizer", "allreduce", "--average-every", "4"],
     "argument --average-every: means nothing to any strategy of this projection "
     "(allreduce); leave it out"),
    (["--dist-optimizer", "neighbor_allreduce", "--compression", "powersgd:4"],
     "argument --compression: neighbor_allreduce cannot send powersgd; it takes fp16, bf16"),
    (["--dist-optimizer", "local_sgd", "--compression", "bf16"],
     "argument --compression: means nothing to any strategy of this projection (local_sgd)"),
    # every strategy projected sends as --compression says: each must take it
    (["--dist-optimizer", "allreduce,local_sgd", "--compression", "bf16"],
     "argument --compression: means nothing to local_sgd, which compresses nothing"),
    (["--dist-optimizer", "allreduce,local_sgd", "--fp16-allreduce"],
     "argument --fp16-allreduce: means nothing to local_sgd, which compresses nothing"),
    (["--dist-optimizer", "allreduce,none", "--compression", "bf16"],
     "argument --compression: means nothing to none, which compresses nothing"),
    (["--dist-optimizer", "allreduce,hierarchical_neighbor_allreduce", "--compression",
      "powersgd:4"], "argument --compression: hierarchical_neighbor_allreduce cannot send "
     "powersgd"),
    (["--dist-optimizer", "allreduce", "--topology", "ring"],
     "argument --topology: means nothing to any strategy of this projection (allreduce)"),
    (["--dist-optimizer", "allreduce", "--hierarchical-allreduce"],
     "argument --hierarchical-allreduce: means nothing to any strategy of this projection"),
    (["--dist-optimizer", "allreduce,none", "--horovod-version", "0.28.1"],
     "argument --horovod-version: means nothing to any strategy of this projection "
     "(allreduce, none); only horovod reads it"),
    (["--average-every", "4"], "argument --average-every: sets up the strategies named with "
     "--dist-optimizer; without it the projection shows the default strategies"),
    (["--slow-ranks", "9999:2", "--np", "1,2,4"], "argument --slow-ranks: rank 9999 does "
     "not exist; the largest worker count projected (--np 4) has ranks 0 to 3"),
    (["--slow-ranks", "0:1"], "argument --slow-ranks: must be none or RANKS:FACTOR[@P]"),
])
def test_a_flag_that_changes_no_row_is_refused_in_one_line(argv, message, tmp_path):
    assert message in refused("simulate", *STATED, *argv, "-o", tmp_path / "p")
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no projection, no chart


def test_the_runs_strategies_are_projected_as_they_ran(tmp_path):
    line = refused("simulate", *TWO_RUNS, "--link", "1gbit", "--topology", "ring",
                   "-o", tmp_path / "p")
    assert line == ("commbench: error: argument --topology: sets up the strategies named "
                    "with --dist-optimizer; without it the projection shows the runs' "
                    "strategies as they ran; name them, or leave it out")


@pytest.mark.parametrize("argv", [
    ["--dist-optimizer", "allreduce,neighbor_allreduce", "--topology", "ring"],
    ["--dist-optimizer", "allreduce,none", "--fp16-allreduce"],  # none sends nothing
    ["--dist-optimizer", "local_sgd", "--average-every", "4"],
    ["--slow-ranks", "3:2", "--np", "1,4"],
])
def test_the_same_flags_where_a_strategy_reads_them_are_taken(argv, tmp_path):
    done = commbench("simulate", *STATED, *argv, "-o", tmp_path)
    assert done.returncode == 0, done.stderr
