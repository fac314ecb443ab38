"""Real datasets from a local path (`--data cifar10:PATH`, `--data imagefolder:PATH`),
read by torchvision and never downloaded: a path without the data is a one-line error.

- cifar10:PATH: torchvision's CIFAR-10 under PATH (the `cifar-10-batches-py` folder
  that `torchvision.datasets.CIFAR10(PATH, download=True)` leaves there); the 10,000
  test images are the validation set.
- imagefolder:PATH: PATH/train and PATH/val, one folder per class (ImageNet's layout,
  torchvision's ImageFolder); validation images are resized and centre-cropped.

Training images are augmented as the field does by their size (--augment auto): CIFAR-10
and images of at most SMALL pixels a side get a random crop of the image padded by an
eighth of its side, and a horizontal flip; larger ones ImageNet's random-resized crop
and a flip. That crop takes 8-100% of an image and stretches it back: right for
ImageNet's large photographs, it leaves a 32-pixel image little to learn from.
--augment crop-flip, resized-crop or none chooses one.

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
AUGMENTS = ("auto", "crop-flip", "resized-crop", "none")
SMALL = 64  # pixels a side: CIFAR's 32, Tiny ImageNet's 64 and smaller are small
# Per-channel mean and standard deviation of the images each kind is usually normalised
# with: CIFAR-10's own, and ImageNet's for image folders.
NORMALIZE = {"cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
             "imagefolder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}
LOADER_WORKERS_GPU = 4  # DataLoader processes per GPU worker (CPU workers read in-process)


@dataclass(frozen=True)
class LocalDataset:
    kind: str
    path: str
    augment: str = "auto"  # as --augment gave it

    @classmethod
    def parse(cls, kind: str, path: str, augment: str = "auto") -> "LocalDataset":
        """The dataset of `--data KIND:PATH`, after checking that PATH holds it."""
        if not path:
            raise UsageError(f"argument --data: {kind} needs a path: {kind}:PATH")
        found = cls(kind, path, augment)
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

    def augmentation(self, image_size: int) -> str:
        """The training augmentation: --augment's, or what `auto` picks for the size."""
        if self.augment != "auto":
            return self.augment
        return "crop-flip" if self.kind == "cifar10" or image_size <= SMALL else "resized-crop"

    def _transforms(self, image_size: int, train: bool):
        from torchvision import transforms as T

        mean, std = NORMALIZE[self.kind]
        augment = self.augmentation(image_size)
        if train and augment == "resized-crop":
            steps = [T.RandomResizedCrop(image_size), T.RandomHorizontalFlip()]
        else:  # the image brought to size; the validation images of ImageNet's layout as
            # its recipe has them (resized to 8/7 of the crop, centre-cropped)
            large = self.kind == "imagefolder" and augment == "resized-crop"
            steps = [] if self.kind == "cifar10" and image_size == 32 else \
                [T.Resize(round(image_size * 256 / 224) if large else image_size),
                 T.CenterCrop(image_size)]
            if train and augment == "crop-flip":
                steps += [T.RandomCrop(image_size, padding=image_size // 8),
                          T.RandomHorizontalFlip()]
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
                                        transform=transform, loader=read_image)
        except (RuntimeError, FileNotFoundError, OSError) as e:
            why = str(e).splitlines()[0].split(". You can use download=True")[0]
            raise UsageError(f"argument --data: cannot read {self.describe()}: {why} "
                             "(commbench never downloads data)") from None


def read_image(path: str):
    """torchvision's image loader, but an image that cannot be decoded is named: PIL
    does not name a truncated one, and a corrupt one only as an open file object."""
    from PIL import UnidentifiedImageError
    from torchvision.datasets.folder import default_loader

    try:
        return default_loader(path)
    except UnidentifiedImageError:
        raise OSError(f"cannot read image {path}: not an image format PIL knows (corrupt "
                      "or not an image)") from None
    except OSError as e:
        raise OSError(f"cannot read image {path}: {e.strerror or e}") from None


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
