"""Models by name: any torchvision classification model, built from its constructor
with the run's number of classes (no weights), and whether it can train on the images
and batches asked for; or a language model by its size's name
(commbench.job.language_models)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from commbench.config.flags import flag, positive_int
from commbench.config.sections import Section
from commbench.errors import UsageError
from commbench.job import language_models
from commbench.job.language_models import LANGUAGE_MODELS, LanguageModelSpec


@dataclass(frozen=True)
class ModelFlags(Section):
    title = "the model and its input"

    model: str = flag("resnet50", "torchvision classification model", metavar="NAME")
    batch_size: int = flag(32, "input batch size per worker", positive_int)
    image_size: int = flag(224, "image height and width in pixels (a dataset's images are "
                           "brought to it)", positive_int)
    seq_len: Optional[int] = flag(
        None, "a language model's sequence length in tokens (default: the model's, "
        "`commbench list`: 128 for lm-tiny, 1024 for gpt2-small, 2048 for llama-1b)",
        positive_int, "TOKENS")
    num_classes: int = flag(1000, "number of classes of the synthetic labels", positive_int)

    @property
    def language_model(self) -> Optional[LanguageModelSpec]:
        """The named size of a language model (commbench.job.language_models), else None."""
        return LANGUAGE_MODELS.get(self.model)

    @property
    def unit(self) -> str:
        """What throughput counts: a language model's tokens, an image model's images."""
        return "tokens" if self.language_model else "images"

    @property
    def per_sample(self) -> int:
        """How many of the unit one sample of a batch is: a sequence's tokens, or 1."""
        spec = self.language_model
        return (self.seq_len or spec.seq_len) if spec else 1

    @classmethod
    def unread(cls, config) -> Dict[str, str]:
        if config.language_model is None:
            moot = {"seq_len": f"sets a language model's sequence length; {config.model} is "
                    "an image model (--image-size sets its input): leave --seq-len out"}
            if config.data != "synthetic":
                moot["num_classes"] = (
                    f"sets the classes of the synthetic batch; --data {config.data} has "
                    "classes of its own (the result records them): leave it out")
            return moot
        return dict.fromkeys(("image_size", "num_classes"), (
            f"{config.model} is a language model: it reads tokens (--seq-len), not images, "
            "and its vocabulary is its own: leave it out"))


# What torch says when a layer's input is smaller than its kernel or pooling window.
TOO_SMALL = re.compile(r"(input|output|kernel) size", re.IGNORECASE)


def model_names() -> List[str]:
    import torchvision.models as models

    if hasattr(models, "list_models"):  # torchvision >= 0.14
        return sorted(models.list_models(module=models))
    return sorted(name for name, obj in vars(models).items()  # torchvision 0.11 (Python 3.9)
                  if name.islower() and not name.startswith("_") and callable(obj))


def build_model(name: str, num_classes: int):
    import torchvision.models as models

    if language_models.is_language_model(name):
        return language_models.logits_per_token(language_models.build(name))
    if name not in model_names():
        raise UsageError(f"argument --model: unknown model {name!r}; choose a torchvision "
                         f"classification model, e.g. resnet18, resnet50, vgg16, or a "
                         f"language model: {', '.join(language_models.LANGUAGE_MODELS)} "
                         f"(`commbench list` shows all)")
    kwargs = {"num_classes": num_classes}
    if name.startswith(("inception", "googlenet")):
        kwargs["aux_logits"] = False  # the extra heads return tuples, not logits
        kwargs["init_weights"] = True
    return getattr(models, name)(**kwargs)


def check_input(model, images, name: str, image_size: int, batch_size: int) -> None:
    """One image through the model, so that what it cannot train on is a clear error on
    every rank now rather than torch's, deep inside the first step: an image smaller
    than its kernels and windows, or a batch that leaves a BatchNorm layer a single
    value per channel (it needs two to normalise in training)."""
    import torch

    if language_models.is_language_model(name):
        return  # any tokens up to its context, which the flags' checks bound
    per_channel: Dict[str, Tuple[int, ...]] = {}  # BatchNorm layer -> one image's shape

    def note(layer: str):
        def hook(_, inputs) -> None:  # None: the layer's input stays as it is
            per_channel.setdefault(layer, tuple(inputs[0].shape[2:]))
        return hook

    hooks = [m.register_forward_pre_hook(note(layer)) for layer, m in model.named_modules()
             if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    model.eval()
    try:
        with torch.no_grad():
            model(images[:1])
    except RuntimeError as e:
        first = (str(e).splitlines() or [""])[0]
        if not TOO_SMALL.search(first):
            raise  # out of memory, a cuDNN or CUDA error: not the user's image size
        raise UsageError(f"argument --image-size: {image_size} is too small for "
                         f"{name} ({first})")
    finally:
        for hook in hooks:
            hook.remove()
        model.train()
    for layer, shape in per_channel.items():
        if batch_size * math.prod(shape) < 2:
            where = "x".join(map(str, shape)) + " px" if shape else "no pixels"
            raise UsageError(
                f"argument --batch-size: {name} cannot train on a batch of {batch_size} "
                f"image of {image_size} px: its BatchNorm layer {layer} would get one value "
                f"per channel ({where} per image), and training needs two; use "
                "--batch-size 2 or more")
