"""The one training step (commbench.job.training_step): the spans it records at each of its
points, in-process on a tiny model, and the complete strategy that docs/plugins.md
shows, run as written."""

import re
import sys
import types
from pathlib import Path

import pytest
import torch

from commbench.timing import spans
from commbench.job.speed_loop import measure_phases
from commbench.timing.spans import PHASES
from commbench.optimizers.mixing import Mixer, combine_step
from commbench.job.training_step import TrainingStep

ROOT = Path(__file__).resolve().parents[1]


def trainable():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,), generator=generator)


def kinds(recorder):
    return [event.kind for event in recorder.events]


def spans_of(recorder, kind):
    return [(event.start, event.end) for event in recorder.events if event.kind == kind]


def called_at(calls, name):
    return lambda at: calls.append((name, at))


@pytest.mark.parametrize("points, expected", [
    ((), ["forward", "backward", "optimizer"]),
    (("after_forward",), ["forward", "post", "backward", "optimizer"]),
    (("before_update",), ["forward", "backward", "wait", "optimizer"]),
    (("after_update",), ["forward", "backward", "optimizer", "wait"]),
    (("after_forward", "before_update"), ["forward", "post", "backward", "wait", "optimizer"]),
    (("after_forward", "before_update", "after_update"),
     ["forward", "post", "backward", "wait", "optimizer", "wait"]),
])
def test_each_point_adds_its_span_where_it_acts(recorder, points, expected):
    model, optimizer = trainable()
    calls = []
    step = TrainingStep(model, optimizer, **{p: called_at(calls, p) for p in points})
    loss = step(*batch())
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert kinds(recorder) == expected
    assert [phase.kind for phase in step.phases] == expected
    # Each hook runs once, in step order, told the clock reading its span starts at.
    assert [name for name, _ in calls] == list(points)
    starts = {phase.start for phase in step.phases}
    assert all(at in starts for _, at in calls)
    # The phases follow each other without a gap (after_update's starts after them).
    recorded = [(e.start, e.end) for e in recorder.events]
    for (_, end), (start, _) in zip(recorded, recorded[1:]):
        assert start >= end
    body = recorded[:-1] if "after_update" in points else recorded
    assert all(end == start for (_, end), (start, _) in zip(body, body[1:]))


def test_the_step_trains_as_sgd_does(recorder):
    model, optimizer = trainable()
    twin, twin_optimizer = trainable()
    images, labels = batch()
    TrainingStep(model, optimizer)(images, labels)
    twin_optimizer.zero_grad()
    torch.nn.functional.cross_entropy(twin(images), labels).backward()
    twin_optimizer.step()
    for mine, theirs in zip(model.parameters(), twin.parameters()):
        assert torch.equal(mine, theirs)


def test_update_replaces_the_optimizer_step(recorder):
    model, optimizer = trainable()
    before = [p.detach().clone() for p in model.parameters()]
    updates = []
    TrainingStep(model, optimizer, update=lambda: updates.append(1))(*batch())
    assert updates == [1]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert kinds(recorder) == ["forward", "backward", "optimizer"]


def test_a_piece_posted_during_backward_makes_its_tail_a_wait(recorder):
    """DDP's rule: after the last bucket is handed over, backward only waits."""
    model, optimizer = trainable()
    posted = []
    # a piece handed over from inside backward, as DDP hands over a bucket
    model.bias.register_hook(lambda grad: posted.append(
        spans.record("comm", spans.now(), spans.now(), "bucket", 4)))
    step = TrainingStep(model, optimizer, waits_after_last_piece=True)
    step(*batch())
    assert kinds(recorder) == ["comm", "forward", "backward", "wait", "optimizer"]
    (_, backward_end), = spans_of(recorder, "backward")
    assert spans_of(recorder, "wait") == [(posted[0].start, backward_end)]


def test_without_a_piece_there_is_no_wait_to_count(recorder):
    model, optimizer = trainable()
    TrainingStep(model, optimizer, waits_after_last_piece=True)(*batch())
    assert kinds(recorder) == ["forward", "backward", "optimizer"]


def test_nothing_is_recorded_outside_a_measured_step():
    recorder = spans.Recorder()
    with recorder.measured_step():
        pass
    model, optimizer = trainable()
    TrainingStep(model, optimizer, after_update=lambda at: None)(*batch())
    assert recorder.events == [] and not spans.recording()


class CountingMixer(Mixer):
    def __init__(self):
        self.calls = []

    def start(self):
        self.calls.append("start")

    def finish(self):
        self.calls.append("finish")

    def piece_bytes(self):
        return 64


@pytest.mark.parametrize("atc, expected", [
    (False, ["comm", "forward", "post", "backward", "wait", "optimizer"]),
    (True, ["forward", "backward", "optimizer", "comm", "wait"]),
])
def test_averaging_strategies_post_their_piece_where_their_span_starts(recorder, atc, expected):
    model, optimizer = trainable()
    mixer = CountingMixer()
    combine_step(model, optimizer, mixer, atc)(*batch())
    assert kinds(recorder) == expected
    assert mixer.calls == ["start", "finish"]
    (piece_start, piece_end), = spans_of(recorder, "comm")
    first_blocked = spans_of(recorder, "wait" if atc else "post")[0]
    assert piece_start == first_blocked[0] and piece_end is not None
    wait_end = spans_of(recorder, "wait")[0][1]
    optimizer_start = spans_of(recorder, "optimizer")[0][0]
    if atc:  # closed inside its wait, nothing after it to overlap
        assert piece_end <= wait_end
    else:  # AWC: closed as the update begins, after the wait for it ended
        assert wait_end == optimizer_start <= piece_end


def test_measure_phases_reads_the_synced_steps_phases():
    model, optimizer = trainable()
    syncs = []
    step = TrainingStep(model, optimizer, sync=lambda: syncs.append(1))
    split = measure_phases(step, *batch(), batches=3)
    assert len(split) == 3 and all(len(row) == len(PHASES) for row in split)
    assert all(seconds >= 0 for row in split for seconds in row)
    assert len(syncs) == 3 * len(PHASES)  # every phase ends with a sync


def test_only_the_training_step_computes_the_loss():
    """The step is written once: no other module of the package computes a loss."""
    sources = [p for folder in ("commbench", "optimizers") for p in (ROOT / folder).rglob("*.py")]
    computing = [p.relative_to(ROOT).as_posix() for p in sources
                 if "cross_entropy(" in p.read_text()]
    assert computing == ["commbench/job/training_step.py"]


def documented_strategy() -> str:
    text = (ROOT / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)
    assert len(blocks) == 1, "docs/plugins.md shows one complete strategy"
    return blocks[0]


def test_the_documented_strategy_is_short_and_runs(recorder, one_worker):
    source = documented_strategy()
    assert len(source.splitlines()) < 40
    module = types.ModuleType("documented_strategy")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(compile(source, "docs/plugins.md", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    strategy = module.PeriodicAverage(one_worker, types.SimpleNamespace(
        options={"period": 2}))
    model, optimizer = trainable()
    step = strategy.wrap(model, optimizer)
    step(*batch())
    assert kinds(recorder) == ["forward", "backward", "optimizer", "wait"]
    with recorder.measured_step():
        step(*batch())  # the second step averages, recorded as a piece inside its wait
    second = [e for e in recorder.events if e.step == 1]
    assert [e.kind for e in second] == ["forward", "backward", "optimizer", "comm", "wait"]
    piece, wait = second[3], second[4]
    assert piece.start == wait.start and wait.start <= piece.end <= wait.end
    assert piece.nbytes == sum(p.numel() * p.element_size() for p in model.parameters())
