"""Real datasets from a local path (commbench.data.local): an image folder trained to
accuracy through a launcher, CIFAR-10 read by torchvision from its own file format,
a worker's shard and its augmentation, and a path without the data refused in one line
(nothing is ever downloaded)."""

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_helpers import commbench
from commbench.data import batches
from commbench.data.local import LocalDataset, read_image
from commbench.errors import UsageError
from launchers import TINY_RUN, mpiexec, only_result, run


def image_folder(root: Path, per_class: int, val: int) -> Path:
    """Two classes told apart by colour: red and blue squares with noise."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for part, count in (("train", per_class), ("val", val)):
        for name, channel in (("red", 0), ("blue", 2)):
            folder = root / part / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 90, (20, 20, 3), dtype=np.uint8)
                pixels[..., channel] += 140
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def fake_cifar(root: Path, per_file: int) -> Path:
    """torchvision's CIFAR-10 layout: five training batches and a test batch, pickled."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        entry = {"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
                 "labels": rng.integers(0, 10, per_file).tolist()}
        (folder / name).write_bytes(pickle.dumps(entry))
    meta = {"label_names": [f"class{i}" for i in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    return root


def test_cifar10_is_read_by_torchvision_augmented_and_partitioned(tmp_path, monkeypatch):
    from torchvision import datasets
    from torchvision.datasets import cifar

    # The fixture cannot carry CIFAR-10's checksums; everything after the checks is real.
    monkeypatch.setattr(datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    found = batches.parse(f"cifar10:{fake_cifar(tmp_path, 40)}", seed=0)
    data = batches.from_path(found, "dirichlet:0.5", 8, 32, rank=1, world_size=2,
                             device=torch.device("cpu"), seed=0)
    assert data.classes == 10 and data.facts["steps_per_epoch"] == 200 // 16
    assert sum(map(sum, data.facts["class_mix"])) == 200  # five training batches of 40
    images, labels = data.next()
    assert images.shape == (8, 3, 32, 32) and labels.shape == (8,)
    assert abs(float(images.mean())) < 0.5  # normalised
    again, _ = data.next()
    assert not torch.equal(images, again)
    val_images, val_labels = batches.validation(found, 32, seed=0)
    assert val_images.shape == (40, 3, 32, 32) and len(val_labels) == 40  # the test batch


def test_a_corrupt_cifar10_is_one_line_and_no_download_is_offered(tmp_path):
    found = batches.parse(f"cifar10:{fake_cifar(tmp_path, 4)}", seed=0)  # no checksums
    with pytest.raises(UsageError) as raised:
        found.dataset(32, train=True)
    assert "cannot read cifar10:" in str(raised.value)
    assert "download=True" not in str(raised.value) and "never downloads" in str(raised.value)


@pytest.mark.parametrize("spec, error", [
    ("cifar10:{tmp}", "no CIFAR-10 under {tmp} (expected {tmp}/cifar-10-batches-py"),
    ("imagefolder:{tmp}", "no image folder at {tmp}: {tmp}/train and {tmp}/val missing"),
    ("cifar10:", "cifar10 needs a path: cifar10:PATH"),
])
def test_a_path_without_the_data_is_one_line(tmp_path, spec, error):
    spec, error = spec.format(tmp=tmp_path), error.format(tmp=tmp_path)
    with pytest.raises(UsageError) as raised:
        batches.parse(spec, seed=0)
    assert error in str(raised.value)
    done = commbench("--data", spec, "--results-dir", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and error in done.stderr, done.stderr
    assert not list(tmp_path.glob("out/*.json"))


def test_an_image_folder_gives_each_worker_its_shard(tmp_path):
    found = LocalDataset.parse("imagefolder", str(image_folder(tmp_path, 12, 3)))
    shards = [batches.from_path(found, "iid", 4, 16, rank, 2, torch.device("cpu"), seed=5)
              for rank in range(2)]
    mix = shards[0].facts["class_mix"]
    assert sum(map(sum, mix)) == 24 and mix == shards[1].facts["class_mix"]  # one partition
    assert shards[0].facts["data"] == f"imagefolder:{tmp_path}"
    images, _ = shards[0].next()
    assert images.shape == (4, 3, 16, 16)  # brought to --image-size
    assert shards[0].facts["augment"] == "crop-flip"  # 16 px: small images


def steps(found, image_size, train=True):
    return [type(step).__name__ for step in found._transforms(image_size, train).transforms]


@pytest.mark.parametrize("kind, augment, image_size, train, expected", [
    ("imagefolder", "auto", 32, True, ["Resize", "CenterCrop", "RandomCrop",
                                       "RandomHorizontalFlip"]),
    ("imagefolder", "auto", 32, False, ["Resize", "CenterCrop"]),
    ("imagefolder", "auto", 224, True, ["RandomResizedCrop", "RandomHorizontalFlip"]),
    ("imagefolder", "auto", 224, False, ["Resize", "CenterCrop"]),
    ("imagefolder", "none", 224, True, ["Resize", "CenterCrop"]),
    ("imagefolder", "resized-crop", 32, True, ["RandomResizedCrop", "RandomHorizontalFlip"]),
    ("cifar10", "auto", 32, True, ["RandomCrop", "RandomHorizontalFlip"]),
    ("cifar10", "auto", 224, True, ["Resize", "CenterCrop", "RandomCrop",
                                    "RandomHorizontalFlip"]),
    ("cifar10", "none", 32, True, []),
])
def test_the_augmentation_fits_the_images_size(kind, augment, image_size, train, expected):
    found = LocalDataset(kind, "unused", augment)
    assert steps(found, image_size, train) == expected + ["ToTensor", "Normalize"]


def test_large_images_validate_as_imagenets_recipe_does():
    resize = LocalDataset("imagefolder", "unused")._transforms(224, False).transforms[0]
    assert resize.size == 256


@pytest.mark.parametrize("data", ["synthetic", "learnable"])
def test_augment_means_nothing_to_generated_data(data):
    done = commbench("--data", data, "--augment", "none")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "commbench: error: argument --augment: augments the images of a dataset read "
        "from disk (--data cifar10:PATH or imagefolder:PATH); generated data has none to "
        "augment: leave it out"], done.stderr


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_two_workers_train_on_an_image_folder_to_accuracy(tmp_path):
    root = image_folder(tmp_path / "colours", 32, 8)
    out = tmp_path / "out"
    done = mpiexec(2, ["-m", "commbench", "--dist-optimizer=allreduce", "--model", "resnet18",
                       "--image-size", "16", "--batch-size", "8", "--reference-iters", "0",
                       "--data", f"imagefolder:{root}", "--target-accuracy", "0.9",
                       "--eval-every", "2", "--max-epochs", "4", "--results-dir", str(out)],
                   timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    doc = only_result(out)
    assert doc["kind"] == "accuracy" and doc["data"]["data"] == f"imagefolder:{root}"
    assert doc["data"]["steps_per_epoch"] == 64 // 16
    assert sum(map(sum, doc["data"]["class_mix"])) == 64
    # colour is easy: the averaged model reaches 90% on the 16 validation images
    assert doc["summary"]["reached"] is True, doc["curve"]


SPOILED = {"truncated": (lambda good: good[:200], "image file is truncated"),
           "corrupt": (lambda good: b"not an image", "not an image format PIL knows")}


@pytest.mark.job
@pytest.mark.timeout(200)
@pytest.mark.parametrize("spoiled", sorted(SPOILED))
def test_an_image_that_cannot_be_read_is_named_with_why(tmp_path, spoiled):
    import sys

    root = image_folder(tmp_path / "colours", 4, 1)
    spoil, why = SPOILED[spoiled]
    for image in (root / "train").rglob("*.png"):
        image.write_bytes(spoil(image.read_bytes()))
    done = run([sys.executable, "-m", "commbench", *TINY_RUN, "--batch-size", "2",
                "--data", f"imagefolder:{root}", "--results-dir", str(tmp_path / "out")],
               timeout=150)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr[-2000:]
    assert re.fullmatch(rf"commbench: error: rank 0: OSError: cannot read image "
                        rf"{re.escape(str(root))}/train/(red|blue)/\d\.png: {why}.*", lines[-1]), \
        lines[-1]


def test_a_dataloader_workers_error_is_said_by_its_own_last_line():
    from torch._utils import ExceptionWrapper

    from commbench.job.failure import what_failed

    try:
        read_image("/nowhere/0.png")
    except OSError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(OSError) as caught:
        wrapped.reraise()
    assert what_failed(caught.value) == \
        "OSError: cannot read image /nowhere/0.png: No such file or directory"
