"""Real datasets from a local path (`--data cifar10:PATH`, `--data imagefolder:PATH`),
read by torchvision and never downloaded: a path without the data is a one-line error.

- cifar10:PATH: torchvision's CIFAR-10 under PATH (the `cifar-10-batches-py` folder
  that `torchvision.datasets.CIFAR10(PATH, download=True)` leaves there). Training
  images get the usual augmentation (random crop with 4 pixels of padding, horizontal
  flip); the 10,000 test images are the validation set.
- imagefolder:PATH: PATH/train and PATH/val, one folder per class (ImageNet's layout,
  torchvision's ImageFolder). Training images get a random resized crop and a flip;
  validation images are resized and centre-cropped.

Images are normalised and brought to --image-size. A worker reads its shard through a
DataLoader: worker processes on GPUs (pinned memory, so copies overlap compute), in
the training process on CPUs, whose cores the training itself needs. The validation set
is held in memory for evaluation outside the clock: keep PATH/val to a few thousand
images.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Tuple

from commbench.errors import UsageError

KINDS = ("cifar10", "imagefolder")
# Per-channel mean and standard deviation of the images each kind is usually normalised
# with: CIFAR-10's own, and ImageNet's for image folders.
NORMALIZE = {"cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
             "imagefolder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}
LOADER_WORKERS_GPU = 4  # DataLoader processes per GPU worker (CPU workers read in-process)


@dataclass(frozen=True)
class LocalDataset:
    kind: str
    path: str

    @classmethod
    def parse(cls, kind: str, path: str) -> "LocalDataset":
        """The dataset of `--data KIND:PATH`, after checking that PATH holds it."""
        if not path:
            raise UsageError(f"argument --data: {kind} needs a path: {kind}:PATH")
        found = cls(kind, path)
        missing = found.missing()
        if missing:
            raise UsageError(f"argument --data: {missing} (commbench never downloads data)")
        return found

    def missing(self) -> str:
        """What is missing under the path, or ""."""
        root = Path(self.path)
        if self.kind == "cifar10":
            if not (root / "cifar-10-batches-py").is_dir():
                return (f"no CIFAR-10 under {self.path} (expected {root / 'cifar-10-batches-py'},"
                        " as torchvision's CIFAR10 leaves it)")
            return ""
        absent = [str(root / part) for part in ("train", "val") if not (root / part).is_dir()]
        return f"no image folder at {self.path}: {' and '.join(absent)} missing" if absent else ""

    def describe(self) -> str:
        return f"{self.kind}:{self.path}"

    def _transforms(self, image_size: int, train: bool):
        from torchvision import transforms as T

        mean, std = NORMALIZE[self.kind]
        if self.kind == "cifar10":
            resize = [] if image_size == 32 else [T.Resize(image_size)]
            augment = [T.RandomCrop(image_size, padding=image_size // 8),
                       T.RandomHorizontalFlip()] if train else []
            steps = resize + augment
        elif train:
            steps = [T.RandomResizedCrop(image_size), T.RandomHorizontalFlip()]
        else:
            steps = [T.Resize(round(image_size * 256 / 224)), T.CenterCrop(image_size)]
        return T.Compose(steps + [T.ToTensor(), T.Normalize(mean, std)])

    def dataset(self, image_size: int, train: bool):
        """torchvision's dataset of the training or validation images."""
        from torchvision import datasets

        transform = self._transforms(image_size, train)
        try:
            if self.kind == "cifar10":
                return datasets.CIFAR10(self.path, train=train, transform=transform,
                                        download=False)
            return datasets.ImageFolder(str(Path(self.path) / ("train" if train else "val")),
                                        transform=transform)
        except (RuntimeError, FileNotFoundError, OSError) as e:
            why = str(e).splitlines()[0].split(". You can use download=True")[0]
            raise UsageError(f"argument --data: cannot read {self.describe()}: {why} "
                             "(commbench never downloads data)") from None


def labels_of(dataset) -> List[int]:
    """Every sample's class, without decoding an image."""
    return list(dataset.targets)


def loader(dataset, indices, batch_size: int, device, seed: int):
    """An endless iterator of (images, labels) batches over `indices`, reshuffled at
    each pass from `seed`, on the device."""
    import torch
    from torch.utils.data import DataLoader, SubsetRandomSampler

    on_gpu = getattr(device, "type", device) == "cuda"
    order = torch.Generator().manual_seed(seed)
    loading = DataLoader(dataset, batch_size=batch_size,
                         sampler=SubsetRandomSampler(indices, generator=order),
                         num_workers=LOADER_WORKERS_GPU if on_gpu else 0,
                         pin_memory=on_gpu, drop_last=True,
                         persistent_workers=on_gpu)
    while True:  # a new pass in a new order
        for images, labels in loading:
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def in_memory(dataset, device) -> Tuple[Any, Any]:
    """The whole (validation) set as two tensors on the device."""
    import torch
    from torch.utils.data import DataLoader

    images, labels = [], []
    for x, y in DataLoader(dataset, batch_size=500):
        images.append(x)
        labels.append(y)
    return torch.cat(images).to(device), torch.cat(labels).to(device)
