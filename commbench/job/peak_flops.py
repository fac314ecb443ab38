"""Model FLOPs utilisation (issue 55) as torchtitan and nanoGPT count it: the model's
training FLOPs per token × tokens/sec per GPU ÷ the GPU's peak. The peak is the dense
(no sparsity) bf16 tensor-core figure of the vendor's datasheet, whatever precision the
run trained in, so that MFUs compare across runs. A device not listed here, and every
CPU, has no peak: its MFU is not known, never guessed."""

from __future__ import annotations

import re
from typing import Optional, Sequence

# (a model in torch.cuda.get_device_name's answer, as whole words, dense bf16 FLOP/s);
# the first match wins, so the more specific names come first.
PEAKS = (
    ("B200", 2.25e15),
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM: "NVIDIA H100 80GB HBM3"
    ("A100", 312e12),  # "NVIDIA A100-SXM4-80GB", not an RTX A1000
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("MI300X", 1307e12),
)


def peak(device_name: Optional[str]) -> Optional[float]:
    """The dense bf16 FLOP/s of a GPU by its name; None where not listed, or no GPU."""
    if not device_name:
        return None
    return next((flops for part, flops in PEAKS
                 if re.search(rf"\b{re.escape(part)}\b", device_name)), None)


def mfu(flops_per_token: float, tokens_per_second_per_gpu: float,
        gpus: Sequence[Optional[str]]) -> Optional[float]:
    """The fraction of the peak the run's model FLOPs reached on each GPU; None where a
    rank's GPU has no known peak, or the ranks' GPUs differ in peak."""
    peaks = {peak(name) for name in gpus}
    if len(peaks) != 1 or None in peaks:
        return None
    return flops_per_token * tokens_per_second_per_gpu / peaks.pop()
