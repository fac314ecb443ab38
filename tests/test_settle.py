"""A strategy's settle() runs between steps, before commbench's own collectives: after
each timed iteration of a speed run, before each evaluation of a run trained to
accuracy (where Bluefog's one-sided puts complete: optimizers/bluefog.py)."""

import os
import sys
from pathlib import Path

import pytest

from launchers import TINY_RUN, run
from probe_plugins import SETTLE_LOG

TESTS = str(Path(__file__).resolve().parent)  # where the plugin is found


def settled_at(tmp_path, name, *flags):
    log = tmp_path / f"{name}.log"
    done = run([sys.executable, "-m", "commbench", "--dist-optimizer=probe_plugins:Settles",
                "--results-dir", str(tmp_path / name), *flags], timeout=240,
               env={SETTLE_LOG: str(log),
                    "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return [int(line) for line in log.read_text().split()]


@pytest.mark.job
@pytest.mark.timeout(600)
def test_settle_comes_after_each_iteration_and_before_each_evaluation(tmp_path):
    # one warm-up step, then 3 iterations of 2 steps
    assert settled_at(tmp_path, "speed", *TINY_RUN) == [3, 5, 7]
    trained = settled_at(tmp_path, "accuracy", "--model", "resnet18", "--image-size", "32",
                         "--batch-size", "32", "--data", "learnable:samples=320,noise=2",
                         "--reference-iters", "0", "--target-accuracy", "1",
                         "--eval-every", "3", "--max-epochs", "0.6")
    assert trained == [3, 6]
