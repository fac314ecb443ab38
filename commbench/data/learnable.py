"""A classification task generated from a seed, with nothing to download: each class
is a smooth random colour pattern (its prototype); an image is its class's prototype,
shifted, scaled in contrast, overlaid by a fainter copy of another class's prototype
(a distractor) and drowned in pixel noise. The prototypes come from the task's seed,
the samples from a seed of their own, so a validation set drawn with another seed is
held out but asks the same question.

Difficulty knobs: `classes` (more is harder) and `noise` (the pixel noise's standard
deviation against the prototypes' unit one; more is harder)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from commbench.data.knobs import parse as parse_knobs

GRID = 4  # a prototype is a GRID x GRID colour pattern, upsampled: smooth, not pixel noise
DISTRACTOR = 0.5  # the distractor's amplitude against the true class's


@dataclass(frozen=True)
class LearnableTask:
    classes: int = 10
    noise: float = 8.0
    samples: int = 20000  # training samples; the validation set is a tenth of it
    seed: int = 0

    @classmethod
    def parse(cls, knobs: str, seed: int) -> "LearnableTask":
        """`classes=20,noise=1.5,samples=50000` (any subset, any order)."""
        values = parse_knobs(knobs, {"classes": int, "samples": int, "noise": float},
                             lambda name, v: v > 0 and (name != "classes" or v >= 2),
                             "learnable", "classes=N (2 or more), noise=X (> 0), samples=N "
                             "(> 0)")
        return cls(seed=seed, **values)

    def describe(self) -> str:
        return f"learnable:classes={self.classes},noise={self.noise:g},samples={self.samples}"

    def prototypes(self, size: int):
        import torch
        import torch.nn.functional as F

        generator = torch.Generator().manual_seed(self.seed)
        grid = torch.randn(self.classes, 3, GRID, GRID, generator=generator)
        smooth = F.interpolate(grid, size=(size, size), mode="bicubic", align_corners=False)
        return (smooth - smooth.mean()) / smooth.std()

    def draw(self, count: int, size: int, seed: int, indices=None) -> Tuple["object", "object"]:
        """The images (float32, len(indices) x 3 x size x size; all `count` by default)
        and the labels of all `count` samples drawn from `seed`. A sample is the same
        whichever others are built with it, so each worker builds only its own."""
        import torch

        prototypes = self.prototypes(size)
        generator = torch.Generator().manual_seed(seed)
        labels = torch.randint(self.classes, (count,), generator=generator)
        others = (labels + torch.randint(1, self.classes, (count,), generator=generator)) \
            % self.classes
        shift = size // 8
        shifts = torch.randint(-shift, shift + 1, (count, 2, 2), generator=generator).tolist()
        contrast = (0.5 + torch.rand(count, generator=generator)).tolist()
        chosen = range(count) if indices is None else [int(i) for i in indices]
        images = torch.empty(len(chosen), 3, size, size)
        noise = torch.Generator()
        for row, i in enumerate(chosen):  # one image at a time: torch.roll has no batched form
            (a, b), (c, d) = shifts[i]
            noise.manual_seed(seed * 1_000_003 + i)
            images[row] = contrast[i] * (prototypes[labels[i]].roll((a, b), dims=(1, 2))
                                         + DISTRACTOR * prototypes[others[i]].roll((c, d),
                                                                                   dims=(1, 2)))
            images[row].add_(torch.randn(3, size, size, generator=noise), alpha=self.noise)
        return images, labels
