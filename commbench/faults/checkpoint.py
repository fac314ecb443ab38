"""Checkpoints of `--recovery restart`, through torch.distributed.checkpoint (DCP): every
rank's model, optimizer and RNG state, and where training stood, one directory per
step in the job's directory (commbench.faults.recovery.job_dir).

Atomic: a step is saved into `step-N.partial`, and rank 0 renames it `step-N` once DCP
has written every rank's part and the metadata, so a checkpoint cut short by a failure
is never loaded. Each rank's state is saved under a key of its own: DCP keeps one copy
of a plain tensor that every rank holds under one key, and the workers of a run need
not hold the same model."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

PREFIX, PARTIAL = "step-", ".partial"
KEEP = 2  # the newest and the one before it: a failure while saving leaves the other
_COMPLETE = re.compile(PREFIX + r"(\d+)")


def step_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def complete(job_dir: Path) -> List[Tuple[int, Path]]:
    """The job's complete checkpoints, newest first."""
    found = [(int(m.group(1)), p) for p in job_dir.glob(PREFIX + "*")
             if (m := _COMPLETE.fullmatch(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def newest_readable(job_dir: Path, say: Callable[[str], None]) -> Optional[Tuple[int, Path]]:
    """(step, path) of the newest complete checkpoint whose metadata reads, or None.
    Rank 0 alone: a checkpoint cut short, or one that does not read, is ignored with
    one line each (and a cut-short one removed, so that its step can be saved again)."""
    from torch.distributed.checkpoint import FileSystemReader

    for partial in sorted(job_dir.glob(PREFIX + "*" + PARTIAL)):
        say(f"Warning: checkpoint {partial} was cut short before it was complete; ignored")
        shutil.rmtree(partial, ignore_errors=True)
    for step, path in complete(job_dir):
        try:
            FileSystemReader(str(path)).read_metadata()
        except Exception as error:  # any damage: the checkpoint is not used, and said so
            why = (str(error).strip().splitlines() or [""])[0]
            say(f"Warning: checkpoint {path} cannot be read ({type(error).__name__}: "
                f"{why}); ignored")
            continue
        return step, path
    return None


def _state(model, optimizer, rank: int, where: str) -> Dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {f"rank{rank}": {"model": model_state, "optimizer": optimizer_state,
                            "rng": torch.get_rng_state(), "where": where}}


def save(job_dir: Path, step: int, model, optimizer, rank: int,
         where: Dict[str, Any]) -> None:
    """Every rank: this step's checkpoint, complete once this returns on rank 0."""
    import torch.distributed.checkpoint as dcp

    partial = job_dir / (step_name(step) + PARTIAL)
    dcp.save(_state(model, optimizer, rank, json.dumps(where)), checkpoint_id=str(partial))
    # DCP returns on every rank once the coordinator (rank 0) wrote the metadata last
    if rank == 0:
        final = job_dir / step_name(step)
        shutil.rmtree(final, ignore_errors=True)  # an unreadable one, ignored on start
        partial.rename(final)
        for _, older in complete(job_dir)[KEEP:]:
            shutil.rmtree(older, ignore_errors=True)


def load(path: Path, model, optimizer, rank: int) -> Dict[str, Any]:
    """Every rank: model, optimizer and RNG state from the checkpoint at path; where
    training stood when it was saved."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer, rank, "")
    dcp.load(state, checkpoint_id=str(path))
    mine = state[f"rank{rank}"]
    set_state_dict(model, optimizer, model_state_dict=mine["model"],
                   optim_state_dict=mine["optimizer"])
    torch.set_rng_state(mine["rng"])
    return json.loads(mine["where"])


def digest(model) -> str:
    """sha256 of the model's parameters and buffers, bit for bit: two runs that trained
    the same model have the same digest."""
    return _digest(model.state_dict().items())


def parameters_digest(model) -> str:
    """sha256 of the model's parameters alone (what torchft's local SGD and DiLoCo
    average; BatchNorm's statistics stay each worker's)."""
    return _digest(model.named_parameters())


def _digest(named) -> str:
    import hashlib

    import torch

    # Viewed as integers of the same width: torch before 2.0 cannot view a tensor as a
    # type of another width, and numpy has no bfloat16.
    same_width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    found = hashlib.sha256()
    for key, value in sorted(named, key=lambda item: item[0]):
        found.update(key.encode())
        flat = value.detach().cpu().contiguous().reshape(-1)
        found.update(flat.view(same_width[flat.element_size()]).numpy().tobytes())
    return found.hexdigest()
