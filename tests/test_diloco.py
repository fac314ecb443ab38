"""diloco: local steps, and every H-th step an outer Nesterov step on the averaged
pseudo-gradients, against the dense reference through mpiexec (outer lr 1 and no
momentum: local SGD; the paper's outer settings; bf16 pseudo-gradients within their
rounding: tests/programs/check_strategies.py); the same updates as torchft's DiLoCo on
one model; a whole run of `python -m commbench`; the flags it refuses."""

import copy

import pytest

from cli_helpers import refused
from programs.check_strategies import CHECKS_TIMEOUT, assert_strategy_clean
from programs.commbench_runs import consensus_of, run_commbench

STRATEGY = "diloco"


@pytest.mark.timeout(CHECKS_TIMEOUT)
@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_outer_steps_match_the_dense_reference(n):
    assert_strategy_clean(n, STRATEGY)


def small_model():
    import torch

    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 5))


def train(model, optimizer, steps, step=None):
    import torch

    generator = torch.Generator().manual_seed(5)
    for _ in range(steps):
        images = torch.rand(2, 3, generator=generator)
        labels = torch.randint(5, (2,), generator=generator)
        if step is None:  # torchft's DiLoCo steps from the inner optimizer's hook
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        else:
            step(images, labels)


def test_its_updates_are_torchfts_diloco(one_worker):
    torchft = pytest.importorskip("torchft.local_sgd", reason="torchft is not installed "
                                  "(the test extra installs it on Python 3.10 and later)")
    import torch
    from unittest.mock import create_autospec

    from commbench.config.run_config import RunConfig
    from commbench.optimizers.diloco import Diloco
    from torchft.manager import Manager
    from torchft.work import _DummyWork

    ours, theirs = small_model(), small_model()
    theirs.load_state_dict(copy.deepcopy(ours.state_dict()))
    config = RunConfig(dist_optimizer=STRATEGY, options={"average_every": 2})
    strategy = Diloco(one_worker, config)
    inner = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    train(ours, inner, 6, strategy.wrap(ours, inner))

    manager = create_autospec(Manager)  # one replica group: its average is its own
    manager._use_async_quorum = False
    manager.errored.return_value = None
    manager.should_commit.return_value = True
    manager.current_step.return_value = 0
    manager.allreduce.side_effect = lambda tensor, should_quantize=False: _DummyWork(tensor)
    inner = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    outer = torch.optim.SGD(theirs.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    with torchft.DiLoCo(manager, [theirs], inner, outer, sync_every=2):
        train(theirs, inner, 6)
    assert manager.should_commit.call_count == 3  # three outer steps, as ours took
    for mine, its in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(mine, its, rtol=1e-6, atol=1e-7)


@pytest.mark.mpi
def test_a_run_takes_outer_steps_every_h_steps(tmp_path):
    doc = run_commbench(2, STRATEGY, ["--average-every", "2", "--outer-dtype", "bf16"],
                        tmp_path)
    assert doc["strategy"] == {"name": STRATEGY, "decentralized": True, "average_every": 2,
                               "outer_lr": 0.7, "outer_momentum": 0.9, "outer_dtype": "bf16",
                               "meetings": 3}  # after steps 2, 4 and 6 of 7
    assert all(distance > 0 for distance in consensus_of(doc))
    sent = doc["samples"]["sent_bytes"][0]
    assert sent[1::2] == [0, 0, 0] and len(set(sent[0::2])) == 1 and sent[0] > 0


@pytest.mark.parametrize("flags, message", [
    (["--outer-momentum", "1"], "argument --outer-momentum: must be below 1, got 1"),
    (["--outer-lr", "0"], "argument --outer-lr: must be a positive, finite number"),
    (["--outer-dtype", "fp16"], "argument --outer-dtype: "),
    (["--average-every", "2,4"],
     "argument --average-every: diloco meets over all workers only: give one H"),
    (["--local-warmup-steps", "3"],
     "argument --local-warmup-steps: means nothing to diloco; only local_sgd reads it"),
])
def test_bad_settings_are_one_line(flags, message):
    assert message in refused("--dist-optimizer", STRATEGY, *flags)


def test_its_outer_settings_mean_nothing_to_local_sgd():
    assert refused("--dist-optimizer", "local_sgd", "--outer-lr", "1") == (
        "commbench: error: argument --outer-lr: means nothing to local_sgd; only diloco "
        "reads it")
