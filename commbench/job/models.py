"""Models by name: any torchvision classification model, built from its constructor
with the run's number of classes (no weights)."""

from __future__ import annotations

from typing import List

from commbench.errors import UsageError


def model_names() -> List[str]:
    import torchvision.models as models

    if hasattr(models, "list_models"):  # torchvision >= 0.14
        return sorted(models.list_models(module=models))
    return sorted(name for name, obj in vars(models).items()  # torchvision 0.11 (Python 3.9)
                  if name.islower() and not name.startswith("_") and callable(obj))


def build_model(name: str, num_classes: int):
    import torchvision.models as models

    if name not in model_names():
        raise UsageError(f"argument --model: unknown model {name!r}; choose a torchvision "
                         f"classification model, e.g. resnet18, resnet50, vgg16 "
                         f"(`commbench list` shows all)")
    kwargs = {"num_classes": num_classes}
    if name.startswith(("inception", "googlenet")):
        kwargs["aux_logits"] = False  # the extra heads return tuples, not logits
        kwargs["init_weights"] = True
    return getattr(models, name)(**kwargs)
