"""Data a run can learn from: the generated task (reproducible from its seeds, one
question for training and validation) and the partitions among workers (sizes,
reproducibility, Dirichlet label skew, refusals)."""

import numpy as np
import pytest
import torch

from commbench.data import partition as partitions
from commbench.data.learnable import LearnableTask
from commbench.errors import UsageError


def test_a_task_is_its_seeds():
    task = LearnableTask(classes=5, noise=1.0, samples=100, seed=3)
    a, la = task.draw(20, 16, seed=7)
    b, lb = task.draw(20, 16, seed=7)
    assert torch.equal(a, b) and torch.equal(la, lb)
    c, _ = task.draw(20, 16, seed=8)  # another seed: other samples (a held-out set)
    assert not torch.equal(a, c)
    other = LearnableTask(classes=5, noise=1.0, samples=100, seed=4)
    assert not torch.equal(task.prototypes(16), other.prototypes(16))
    assert a.shape == (20, 3, 16, 16) and set(la.tolist()) <= set(range(5))


def test_without_noise_an_image_is_closest_to_its_own_class():
    task = LearnableTask(classes=4, noise=1e-6, seed=1)
    images, labels = task.draw(200, 16, seed=2)
    prototypes = task.prototypes(16).flatten(1)
    # correlation with each prototype at the best shift would be exact; unshifted, the
    # true class still wins for most images (the distractor is at half amplitude)
    scores = images.flatten(1) @ prototypes.T
    assert (scores.argmax(1) == labels).float().mean() > 0.4  # chance is 0.25


@pytest.mark.parametrize("knobs, error", [("classes=1", "classes=1"), ("noise=-1", "noise=-1"),
                                          ("size=3", "size=3"), ("samples=ten", "samples=ten")])
def test_bad_knobs_are_one_line(knobs, error):
    with pytest.raises(UsageError, match=f"argument --data: learnable's '{error}' is not"):
        LearnableTask.parse(knobs, 0)


def test_knobs_parse():
    task = LearnableTask.parse("noise=2.5, classes=20", 9)
    assert (task.classes, task.noise, task.samples, task.seed) == (20, 2.5, 20000, 9)
    assert task.describe() == "learnable:classes=20,noise=2.5,samples=20000"


LABELS = np.repeat(np.arange(10), 100)  # 1000 samples, 100 per class


def test_iid_shards_are_equal_disjoint_and_reproducible():
    shards = partitions.partition(LABELS, 3, "iid", seed=1)
    assert [len(s) for s in shards] == [333, 333, 333]
    flat = torch.cat(shards)
    assert len(set(flat.tolist())) == len(flat)
    again = partitions.partition(LABELS, 3, "iid", seed=1)
    assert all(torch.equal(a, b) for a, b in zip(shards, again))
    assert not torch.equal(shards[0], partitions.partition(LABELS, 3, "iid", seed=2)[0])


def skew(shards):
    """Mean share of each worker's largest class."""
    mix = np.array(partitions.class_mix(LABELS, shards, 10))
    return float(np.mean(mix.max(1) / mix.sum(1)))


def test_dirichlet_covers_every_sample_once_and_small_alpha_skews_labels():
    shards = partitions.partition(LABELS, 4, "dirichlet:0.1", seed=5)
    flat = torch.cat(shards).tolist()
    assert sorted(flat) == list(range(len(LABELS)))
    assert skew(shards) > 0.3  # a few classes per worker (IID: about 0.1 each)
    assert skew(partitions.partition(LABELS, 4, "dirichlet:100", seed=5)) < 0.15
    again = partitions.partition(LABELS, 4, "dirichlet:0.1", seed=5)
    assert all(torch.equal(a, b) for a, b in zip(shards, again))
    line = partitions.describe(partitions.class_mix(LABELS, shards, 10))
    assert line.startswith("worker 0: ") and line.count("worker") == 4


@pytest.mark.parametrize("spec", ["dirichlet:0", "dirichlet:-1", "dirichlet:x", "iid:2",
                                  "shards"])
def test_bad_partitions_are_one_line(spec):
    with pytest.raises(UsageError, match=r"argument --partition: .* is not one of iid, "):
        partitions.parse(spec)


def test_a_partition_that_leaves_a_worker_nothing_is_refused():
    with pytest.raises(UsageError, match="leaves worker"):
        partitions.partition(np.zeros(3, dtype=int), 8, "dirichlet:0.01", seed=0)


def test_a_worker_builds_only_its_samples_and_they_are_the_same_samples():
    task = LearnableTask(classes=3, noise=0.5, seed=2)
    everything, labels = task.draw(30, 8, seed=11)
    mine, same_labels = task.draw(30, 8, seed=11, indices=torch.tensor([4, 17, 29]))
    assert torch.equal(mine, everything[[4, 17, 29]]) and torch.equal(labels, same_labels)


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_every_strategy_trains_on_the_same_partition_of_a_learnable_task(tmp_path):
    from launchers import TINY_RUN, mpiexec, only_result

    mixes = []
    for strategy in ("allreduce", "neighbor_allreduce"):
        out = tmp_path / strategy
        done = mpiexec(2, ["-m", "commbench", f"--dist-optimizer={strategy}", *TINY_RUN,
                           "--data", "learnable:samples=600,classes=4", "--partition",
                           "dirichlet:0.5", "--results-dir", str(out)], timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Data: learnable:classes=4,noise=8,samples=600, 37 steps per epoch; partition " \
               "dirichlet:0.5: worker 0: " in done.stdout
        data = only_result(out)["data"]
        assert data["data"] == "learnable:classes=4,noise=8,samples=600"
        assert sum(map(sum, data["class_mix"])) == 600 and len(data["class_mix"]) == 2
        mixes.append(data["class_mix"])
    assert mixes[0] == mixes[1]


@pytest.mark.parametrize("data", ["learnable:classes=4", "cifar10:/nowhere"])
def test_num_classes_with_a_dataset_of_its_own_classes_is_one_line_exit_2(data, tmp_path):
    """The dataset's classes are used (and recorded), so the flag would change nothing."""
    from cli_helpers import commbench

    done = commbench("--data", data, "--num-classes", "5", "--max-epochs", "1",
                     "--results-dir", str(tmp_path))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == (f"commbench: error: argument --num-classes: sets the classes of "
                           f"the synthetic batch; --data {data} has classes of its own (the "
                           "result records them): leave it out\n")
    assert not list(tmp_path.iterdir())
