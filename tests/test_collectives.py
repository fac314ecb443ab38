"""The counted collectives a plugin calls (commbench.comm.collectives): each call is one
communication piece from the point's clock reading, carrying what this rank sends as
the transport moves it, and leaves its tensors holding the result. Here
torch.distributed is rank 0 or 1 of 4 whose collectives move nothing: what is counted,
not what moves (tests/test_plugin_doc.py runs them for real under mpiexec)."""

import pytest
import torch
import torch.distributed as dist

from commbench.timing import wire
from commbench.comm import collectives
from commbench.timing.wire import Sent


def as_rank(monkeypatch, rank):
    calls = []
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(dist, "all_reduce", lambda t, group=None: calls.append(t))
    monkeypatch.setattr(dist, "broadcast", lambda t, src, group=None: calls.append((t, src)))
    return calls


def test_an_allreduce_is_one_piece_sent_as_a_ring_per_tensor(recorder, monkeypatch):
    calls = as_rank(monkeypatch, 0)
    weight = torch.nn.Parameter(torch.full((10,), 8.0))
    bias = torch.full((3,), 4.0)
    collectives.all_reduce([weight, bias], 1.5, "parameter average")
    [piece] = recorder.events
    assert (piece.kind, piece.start, piece.name, piece.nbytes) == \
        ("comm", 1.5, "parameter average", 52)
    assert piece.end is not None and piece.end >= piece.start
    assert Sent(piece.sent, piece.messages) == \
        wire.ring_allreduce(40, 4) + wire.ring_allreduce(12, 4) == Sent(78, 12)
    assert len(calls) == 2
    # averaged in place (the sum is the tensor itself here), the parameter still a leaf
    assert torch.equal(weight.detach(), torch.full((10,), 2.0)) and weight.is_leaf
    assert torch.equal(bias, torch.full((3,), 1.0))
    collectives.all_reduce([bias], average=False)
    assert torch.equal(bias, torch.full((3,), 1.0)) and recorder.events[1].name == "allreduce"


@pytest.mark.parametrize("rank, sent", [(0, Sent(3 * 40, 3)), (1, Sent(0, 0))])
def test_a_broadcast_is_sent_by_its_root_to_each_other_rank(recorder, monkeypatch,
                                                            rank, sent):
    calls = as_rank(monkeypatch, rank)
    collectives.broadcast([torch.zeros(10)], root=0)
    [piece] = recorder.events
    assert (piece.kind, piece.name, piece.nbytes) == ("comm", "broadcast", 40)
    assert Sent(piece.sent, piece.messages) == sent
    assert [src for _, src in calls] == [0]
