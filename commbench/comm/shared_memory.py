"""One machine's buffers in shared memory: every rank of a machine maps the same files
on /dev/shm, one per buffer, each holding one slot per rank, so the machine's sum reads
its ranks' slots where they wrote them and every rank reads the result where the leader
wrote it, without sending the bytes through sockets.

The machine's leader (its first rank) makes the files and reserves their pages up front
(so a full /dev/shm refuses them here, not with SIGBUS mid-step); the others map them.
Their names go as soon as every rank has mapped them (the mappings outlive the names),
so a job that dies leaves nothing behind in /dev/shm.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from typing import List, Optional, Sequence, Tuple

SHM_DIR = "/dev/shm"
MARKER_BYTES = 8  # after the slots: what the leader wrote, for the others to check


def machine_slots(shapes: Sequence[Tuple[int, "object"]], group, leader: int, local: int,
                  size: int) -> Optional[List["object"]]:
    """One [size, numel] tensor per (numel, dtype) in `shapes`, shared by the `size`
    ranks of this machine (`group`, first rank `leader`; this rank is the machine's
    `local`-th). None on every rank of the job when any machine could not make them (no
    /dev/shm, too little room in it, ranks of one machine that do not share it).
    Collective: every rank of the job calls it with the same shapes."""
    import torch
    import torch.distributed as dist

    marker = secrets.randbits(62)
    sizes = [size * numel * torch.empty((), dtype=dtype).element_size()
             for numel, dtype in shapes]
    paths = _make_all(sizes, marker) if local == 0 else None
    shared = [paths, marker]
    dist.broadcast_object_list(shared, src=leader, group=group)
    paths, marker = shared
    slots = None
    if paths and all(_marked(path, nbytes, marker) for path, nbytes in zip(paths, sizes)):
        slots = [torch.from_file(path, shared=True, size=size * numel, dtype=dtype)
                 .view(size, numel) for path, (numel, dtype) in zip(paths, shapes)]
    ok = torch.tensor([1 if slots is not None else 0])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # every rank of the job has mapped them, or not
    if local == 0:
        for path in paths or []:
            os.unlink(path)
    return slots if ok.item() else None


def _make_all(sizes: Sequence[int], marker: int) -> Optional[List[str]]:
    """A file per size on /dev/shm, or None (and none left) when there is no room."""
    paths: List[str] = []
    for nbytes in sizes:
        path = _make(nbytes, marker)
        if path is None:
            for made in paths:
                os.unlink(made)
            return None
        paths.append(path)
    return paths


def _make(nbytes: int, marker: int) -> Optional[str]:
    """A file of nbytes of slots on /dev/shm whose pages are reserved, the marker after
    them; None when there is no room for it."""
    try:
        fd, path = tempfile.mkstemp(prefix="commbench-machine-", dir=SHM_DIR)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, nbytes + MARKER_BYTES)
        os.pwrite(fd, marker.to_bytes(MARKER_BYTES, "little"), nbytes)
        return path
    except OSError:
        os.unlink(path)
        return None
    finally:
        os.close(fd)


def _marked(path: str, nbytes: int, marker: int) -> bool:
    """Whether this rank sees the file the leader made (not another /dev/shm: a
    container of its own), by its size and marker."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        found = os.pread(fd, MARKER_BYTES + 1, nbytes)  # one byte more: none may follow
    finally:
        os.close(fd)
    return found == marker.to_bytes(MARKER_BYTES, "little")
