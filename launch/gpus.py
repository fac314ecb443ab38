"""One GPU per rank, chosen before any NCCL operation: which GPU is a rank's own,
what each rank claims, the check that no two ranks of a machine share one, and NCCL's
watchdog that ends the job when a collective fails."""

from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

from commbench.errors import UsageError


def torch_older_than(major: int, minor: int) -> bool:
    import torch

    return tuple(int(part) for part in torch.__version__.split(".")[:2]) < (major, minor)


def nccl_errors_end_the_job() -> None:
    """NCCL's watchdog ends the job when a collective fails or outlasts --timeout;
    without it a dead peer leaves the others waiting in a CUDA sync (older torch).
    The spelling this torch reads: TORCH_NCCL_* from torch 2.2, NCCL_* before (newer
    torch reads the old one too, and warns on every rank that it is deprecated)."""
    prefix = "" if torch_older_than(2, 2) else "TORCH_"
    os.environ.setdefault(f"{prefix}NCCL_ASYNC_ERROR_HANDLING", "1")


def gpu_index(local_rank: int) -> int:
    """This rank's GPU: its local rank, or the only GPU it sees (a launcher that gives
    each rank its own CUDA_VISIBLE_DEVICES, as `srun --gpus-per-task=1` does)."""
    import torch

    return 0 if torch.cuda.device_count() == 1 else local_rank


def claim(index: int) -> Tuple[Optional[str], int, Optional[str]]:
    """(CUDA_VISIBLE_DEVICES, GPU index, GPU name) of this rank: two ranks of one
    machine with equal visible devices and index would share a GPU."""
    import torch

    gpus = torch.cuda.device_count()
    name = torch.cuda.get_device_name(index) if index < gpus else None
    return os.environ.get("CUDA_VISIBLE_DEVICES"), index, name


def check_one_gpu_each(hostnames: List[str], claims: List[Any]) -> None:
    """Every rank sees every rank's claim, so every rank stops here alike."""
    for host in dict.fromkeys(hostnames):
        mine = [(visible, index, name) for h, (visible, index, name) in zip(hostnames, claims)
                if h == host]
        gpus = {(visible, index) for visible, index, name in mine if name is not None}
        if len(gpus) < len(mine):
            raise UsageError(f"machine {host} runs {len(mine)} ranks but they have only "
                             f"{len(gpus)} GPU(s) between them: start at most one rank per "
                             "GPU, or pass --no-cuda")
