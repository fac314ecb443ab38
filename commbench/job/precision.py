"""Mixed precision (--amp): the forward pass under torch's autocast, in bfloat16 (CPU or
GPU) or float16 (GPU, with torch's GradScaler for the loss scaling), for every strategy
alike, since it is applied to the model and the optimizer before a plugin wraps them.

- The model is wrapped so that its forward runs under autocast and returns float32
  logits (autocast would compute the loss in float32 too).
- float16 only: the gradient arriving at the logits is multiplied by the scaler's scale,
  which scales every gradient exactly as scaling the loss would; the optimizer's step
  becomes GradScaler.step (unscale, skip the step on inf/nan) and GradScaler.update.
  The optimizer's class is swapped for a subclass with that step, so a plugin that
  wraps the optimizer (Horovod's, Bluefog's) steps through it after its own exchange.
"""

from __future__ import annotations

from typing import Any, Tuple

from commbench.errors import UsageError

AMP_MODES = ("off", "fp16", "bf16")
# --amp's default: bf16 for a language model on a GPU that has bfloat16 (as nanoGPT and
# torchtitan train), off otherwise. Not on the CPU: autocast's bf16 there is slower than
# fp32 on CPUs without bfloat16 instructions, which torch does not tell publicly.
AUTO = "auto"


def resolve(mode: str, language_model: bool, device) -> str:
    """The --amp mode a run trains in and records: `mode`, or for "auto" the model's."""
    if mode != AUTO:
        return mode
    import torch

    has_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return "bf16" if language_model and has_bf16 else "off"


def check(mode: str, device_type: str) -> None:
    if mode == "fp16" and device_type != "cuda":
        raise UsageError("argument --amp: fp16 needs a GPU (its loss scaling is CUDA's); "
                         "use --amp bf16 on the CPU")


def mixed_precision(model, optimizer, mode: str, device) -> Tuple[Any, Any]:
    """The model and optimizer to train with under --amp `mode` (unchanged for off)."""
    if mode == "off":
        return model, optimizer
    import torch

    dtype = torch.float16 if mode == "fp16" else torch.bfloat16
    scaler = None
    if mode == "fp16":
        scaler = _grad_scaler()
        _step_through(optimizer, scaler)
    return Autocast(model, device.type, dtype, scaler), optimizer


def _grad_scaler():
    import torch

    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def _autocast_module():
    import torch

    class _Autocast(torch.nn.Module):
        """model under autocast; float32 logits; gradients scaled at the logits."""

        def __init__(self, model, device_type: str, dtype, scaler):
            super().__init__()
            self.model = model
            self.device_type, self.dtype, self.scaler = device_type, dtype, scaler

        def forward(self, x):
            with torch.autocast(self.device_type, dtype=self.dtype):
                out = self.model(x)
            out = out.float()
            if self.scaler is not None and out.requires_grad:
                out.register_hook(self.scaler.scale)
            return out

    return _Autocast


def Autocast(model, device_type: str, dtype, scaler):  # noqa: N802 (a class, built lazily)
    return _autocast_module()(model, device_type, dtype, scaler)


def _step_through(optimizer, scaler) -> None:
    """Make optimizer.step() GradScaler's step and update, for whoever calls it (a
    plugin's optimizer class derived from this one reaches it through super())."""
    base = type(optimizer)

    class _View:
        """What GradScaler.step needs of an optimizer, stepping with base's step."""

        def __init__(self, owner):
            self.owner, self.param_groups = owner, owner.param_groups

        def step(self, *args, **kwargs):
            return base.step(self.owner, *args, **kwargs)

    def step(self, *args, **kwargs):
        result = scaler.step(_View(self), *args, **kwargs)
        scaler.update()
        return result

    optimizer.__class__ = type(base.__name__, (base,), {"step": step})
