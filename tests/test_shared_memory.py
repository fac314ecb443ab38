"""A machine's shared slots (commbench.comm.shared_memory), on one rank: their shapes,
that nothing is left behind, and that every rank gives up alike when they cannot be
made. That a machine's ranks really share them, and sum right through them, is checked
against the dense reference on emulated machines (tests/test_cluster.py)."""

import errno
import os

import pytest
import torch

from commbench.comm import shared_memory

SHAPES = [(1000, torch.float32), (7, torch.float64), (3, torch.float16)]


@pytest.fixture
def one_rank(tmp_path, monkeypatch):
    from commbench.launch import distributed
    from commbench.launch.detect import LaunchInfo

    monkeypatch.setattr(shared_memory, "SHM_DIR", str(tmp_path))
    ctx = distributed.init_distributed(LaunchInfo("single", 0, 1, 0, 1, 0), True, 30)
    yield ctx
    distributed.leave_libraries()


def slots(size=1):
    return shared_memory.machine_slots(SHAPES, None, leader=0, local=0, size=size)


def test_one_slot_per_rank_of_each_buffer_and_no_file_left(one_rank, tmp_path):
    found = slots()
    assert [(s.shape, s.dtype) for s in found] == [((1, n), d) for n, d in SHAPES]
    for value, s in enumerate(found):  # the buffers do not overlap
        s.fill_(value + 1)
    assert [s.double().unique().tolist() for s in found] == [[1.0], [2.0], [3.0]]
    assert list(tmp_path.iterdir()) == []  # the name went once every rank had mapped it


def test_no_room_in_shared_memory_gives_none_and_leaves_nothing(one_rank, tmp_path,
                                                                monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shared_memory.os, "posix_fallocate", full)
    assert slots() is None
    assert list(tmp_path.iterdir()) == []


def test_no_shared_memory_directory_gives_none(one_rank, tmp_path, monkeypatch):
    monkeypatch.setattr(shared_memory, "SHM_DIR", str(tmp_path / "absent"))
    assert slots() is None


def test_a_rank_that_does_not_see_the_files_gives_none_and_they_are_removed(
        one_rank, tmp_path, monkeypatch):
    monkeypatch.setattr(shared_memory, "_marked", lambda path, nbytes, marker: False)
    assert slots() is None
    assert list(tmp_path.iterdir()) == []


def test_another_files_marker_or_size_is_not_taken_for_the_leaders():
    path = shared_memory._make(64, marker=12345)
    try:
        assert shared_memory._marked(path, 64, 12345)
        assert not shared_memory._marked(path, 64, 54321)  # another machine's /dev/shm
        assert not shared_memory._marked(path, 32, 12345)
        assert not shared_memory._marked(path + "-absent", 64, 12345)
    finally:
        os.unlink(path)
