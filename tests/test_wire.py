"""Bytes on the wire (commbench.timing.wire): each algorithm's share per rank, the sums per step
from recorded spans, and the summary; what an engine sends out of sight is not measured.
Whole runs check the recorded bytes against the ring (tests/test_run_mpi.py), a periodic
strategy's steps (tests/test_local_sgd.py) and a neighbor exchange's peers (here)."""

import pytest

from commbench.result import record
from commbench.timing import wire
from commbench.timing.spans import Span
from commbench.timing.wire import NOTHING, Sent


def test_a_ring_allreduce_sends_two_n_minus_one_chunks_padding_included():
    assert wire.ring_allreduce(1000, 4) == Sent(6 * 250, 6)
    assert wire.ring_allreduce(1001, 4) == Sent(6 * 251, 6)  # the last chunk padded
    assert wire.ring_allreduce(1000, 1) == NOTHING and wire.ring_allreduce(0, 4) == NOTHING


def test_only_a_broadcasts_root_sends_and_to_each_counts_every_peer():
    assert wire.broadcast(100, 4, root=True) == Sent(300, 3)
    assert wire.broadcast(100, 4, root=False) == NOTHING
    assert wire.to_each(100, 2, messages_each=3) == Sent(200, 6)
    assert wire.to_each(0, 2) == NOTHING


def piece(step, sent, messages, kind="comm"):
    return Span(step, kind, 0.0, 1.0, sent=sent, messages=messages)


def test_steps_sum_their_pieces_and_steps_without_any_send_nothing():
    spans = [piece(4, 10, 1), piece(4, 5, 2), piece(6, 7, 1), piece(5, 99, 9, "wait")]
    assert wire.per_step(spans, [4, 5, 6]) == [Sent(15, 3), NOTHING, Sent(7, 1)]


def test_the_summary_of_a_periodic_strategy_says_what_its_communicating_steps_send():
    sent = [[Sent(800, 2), NOTHING, NOTHING, NOTHING]] * 2
    summary = wire.summarize(sent, images_per_step=8)
    assert summary == {"bytes_per_step": 200.0, "messages_per_step": 0.5,
                       "bytes_per_image": 25.0, "communicating_steps": 0.25,
                       "bytes_per_communicating_step": 800.0}


def strategy(sees_wire, counts_messages=True, communicates=True):
    return type("Plugin", (), {"sees_wire": sees_wire, "counts_messages": counts_messages,
                               "communicates": communicates})()


@pytest.mark.parametrize("plugin, sent, flagged", [
    (strategy(True), [0, 0], True),  # several ranks, none counted a byte
    (strategy(True), [0, 8], False),
    (strategy(True), [0], False),  # one worker sends nothing
    (strategy(True, communicates=False), [0, 0], False),  # `none`
    (strategy(False), [0, 0], False),  # an engine out of sight: not measured, said so
])
def test_a_strategy_that_communicates_and_counted_no_byte_is_flagged(plugin, sent, flagged):
    doc = {"summary": {}}
    record.flag_unrecorded_wire(doc, plugin, sent)
    assert doc == {"summary": {"wire_unrecorded": True} if flagged else {}}


def test_rank_0_says_in_one_line_that_no_byte_was_counted():
    from commbench.job.console import wire_lines

    summary = {"wire": wire.summarize([[NOTHING]] * 2, 8), "wire_unrecorded": True}
    assert wire_lines(summary) == [
        "On the wire: NOT RECORDED: this strategy communicates but counted no bytes "
        '(docs/plugins.md, "Bytes on the wire"); its 0 bytes are not what it sent']


def test_an_engine_that_communicates_out_of_sight_records_no_bytes():
    doc = {"summary": {}, "samples": {}}
    record.add_wire(doc, strategy(False), [[piece(0, 10, 1)]], None, 8)
    assert doc == {"summary": {"wire": None}, "samples": {}}


def test_tensors_handed_to_an_engine_count_their_bytes_but_no_messages():
    """Horovod's gradients, recorded as its compression hands them over: bytes sent as
    a ring allreduce; the messages are Horovod's fusion's, not counted."""
    doc = {"summary": {}, "samples": {}}
    handed = Span(0, "handed", 1.0, 1.0, "handed to Horovod", 8, None, 12, 0)
    record.add_wire(doc, strategy(True, counts_messages=False),
                    [[handed, piece(0, 10, 1), Span(1, "forward", 0.0, 1.0)]], None, 8)
    assert doc["samples"] == {"sent_bytes": [[22, 0]], "sent_messages": None}
    sent = doc["summary"]["wire"]
    assert sent["bytes_per_step"] == 11 and sent["messages_per_step"] is None
    from commbench.job.console import wire_lines

    assert "in messages the engine fused out of sight per step" in wire_lines(doc["summary"])[0]


def test_a_periodic_strategy_gets_the_split_of_its_two_kinds_of_step():
    doc = {"summary": {}, "samples": {}}
    events = [[piece(0, 10, 1), Span(1, "forward", 0.0, 1.0)]] * 2
    split = [[[1.0, 0.5, 0, 0.5, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0, 0]]] * 2
    record.add_wire(doc, strategy(True), events, split, 8)
    assert doc["samples"] == {"sent_bytes": [[10, 0]] * 2, "sent_messages": [[1, 0]] * 2}
    by_steps = doc["summary"]["step_split_by_steps"]
    assert by_steps["communicating"]["step"]["mean"] == 1.0
    assert by_steps["local"]["step"]["mean"] == 0.5


@pytest.mark.parametrize("narrow, sent", [(None, 4 * 6 * 2), ("float16", 2 * 6 * 2),
                                         ("bfloat16", 2 * 6 * 2)])
def test_a_neighbor_exchange_sends_its_buffers_to_each_out_neighbor(narrow, sent):
    import torch

    from commbench.comm.neighbor_exchange import NeighborExchange
    from commbench.topology import build_schedule

    schedule = build_schedule("ring", 4, False)  # i sends to i - 1 and i + 1
    exchange = NeighborExchange([torch.zeros(6)], schedule, 0,
                                narrow=narrow and getattr(torch, narrow),
                                chunk_bytes=8)
    assert exchange.wire() == Sent(sent, 2 * len(exchange.chunks))
    assert exchange.piece_bytes() == sent


@pytest.mark.parametrize("ranks, total", [(2, 2.0), (3, 4.5), (4, 6.0), (5, 8.5), (6, 11.0),
                                          (8, 14.0)])
def test_open_mpis_large_allreduce_sends_the_rings_bytes_only_on_a_power_of_two(ranks, total):
    """Rabenseifner's allreduce: on 3 ranks, rank 1 sends its halves to rank 0 (S), rank
    0 sends one half to it (S/2), halves and doubles with rank 2 (S) and sends it the
    sum (S): 4.5 S in all where a ring sends 4 S (emulated links' counters: 4.51 S)."""
    S = 4800
    sent = [wire.halving_doubling_allreduce(S, ranks, r).nbytes for r in range(ranks)]
    assert sum(sent) == total * S
    if ranks & (ranks - 1) == 0:
        assert sent == [wire.ring_allreduce(S, ranks).nbytes] * ranks
    assert wire.halving_doubling_allreduce(0, ranks, 0) == NOTHING
