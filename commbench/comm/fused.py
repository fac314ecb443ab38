"""Parameters as views into a few flat buffers, so that a whole model travels as one
message per buffer and nothing is copied before sending.

Used by the strategies that communicate parameters (neighbor_allreduce,
hierarchical_neighbor_allreduce).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import torch


def fuse_parameters(model: "torch.nn.Module",
                    into: Optional[List["torch.Tensor"]] = None) -> List["torch.Tensor"]:
    """Move every parameter of `model` into one contiguous buffer per (device, dtype)
    and return the buffers, in order of first appearance.

    Each parameter's `.data` becomes a view into its buffer, so the optimizer (which
    holds the Parameter objects, not their storage) keeps working unchanged, and a
    write into a buffer is a write into the model. Call it once per model, before
    training, and do not move the model to another device afterwards; `into`: buffers
    to move them into instead of new ones, as the first call returned them (a mixer
    that keeps them elsewhere, such as in shared memory).
    """
    import torch

    groups: Dict[Tuple[object, object], List[torch.nn.Parameter]] = {}
    for p in model.parameters():
        groups.setdefault((p.device, p.dtype), []).append(p)
    buffers = []
    with torch.no_grad():
        for k, ((device, dtype), params) in enumerate(groups.items()):
            flat = into[k] if into is not None else \
                torch.empty(sum(p.numel() for p in params), dtype=dtype, device=device)
            offset = 0
            for p in params:
                view = flat[offset:offset + p.numel()].view_as(p)
                view.copy_(p)
                p.data = view
                offset += p.numel()
            buffers.append(flat)
    return buffers
