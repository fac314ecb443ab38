"""Bytes on the wire: what a rank sends for each communication piece, and in how many
messages, counted where a strategy hands the piece to its transport (the piece's size
and the algorithm that moves it), never from the model's size. A piece recorded as a
span (commbench.timing.spans) carries them; the result sums them per step (`summary.wire`).

The algorithms are the transports' own: gloo's and NCCL's allreduce of large buffers is
a ring (a reduce-scatter, then an allgather, each n - 1 rounds of one chunk per rank),
a broadcast inside a machine goes from the root to each other rank, and a neighbor
exchange sends the buffers once to each out-neighbor. What a rank sends to itself or
through shared memory crosses no wire and is not counted.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, NamedTuple, Sequence


class Sent(NamedTuple):
    """What one rank put on the wire for one piece."""

    nbytes: int
    messages: int

    def __add__(self, other: "Sent") -> "Sent":  # type: ignore[override]
        return Sent(self.nbytes + other.nbytes, self.messages + other.messages)


NOTHING = Sent(0, 0)


def ring_allreduce(nbytes: int, ranks: int) -> Sent:
    """Each rank's share of a ring allreduce of nbytes over ranks: 2 (n - 1) chunks of
    ceil(nbytes / n) bytes, padding included."""
    if ranks < 2 or nbytes <= 0:
        return NOTHING
    chunk = -(-nbytes // ranks)
    return Sent(2 * (ranks - 1) * chunk, 2 * (ranks - 1))


def halving_doubling_allreduce(nbytes: int, ranks: int, rank: int) -> Sent:
    """One rank's share of Rabenseifner's allreduce (reduce-scatter by recursive
    halving, allgather by recursive doubling), which Open MPI's MPI_Allreduce runs on
    large messages. On a power of two it sends what the ring sends. On others the first
    2r ranks (r ranks above the power of two p') first pair up: each odd rank sends its
    halves to its even neighbour, which joins the p' ranks of the halving and doubling
    and sends the result back at the end."""
    if ranks < 2 or nbytes <= 0:
        return NOTHING
    below = 1 << (ranks.bit_length() - 1)  # p'
    extra = ranks - below  # r
    rounds = below.bit_length() - 1  # log2 p'
    halving = Sent(ring_allreduce(nbytes, below).nbytes, 2 * rounds)
    if rank >= 2 * extra:
        return halving
    if rank % 2:  # one half to its even neighbour, then its sum of the other
        return Sent(nbytes, 2)
    return Sent(nbytes // 2, 1) + halving + Sent(nbytes, 1)


def broadcast(nbytes: int, ranks: int, root: bool) -> Sent:
    """A broadcast from the root to each other rank: only the root sends."""
    if not root or ranks < 2 or nbytes <= 0:
        return NOTHING
    return Sent((ranks - 1) * nbytes, ranks - 1)


def to_each(nbytes: int, peers: int, messages_each: int = 1) -> Sent:
    """The same nbytes to each of peers, in messages_each messages apiece."""
    return Sent(nbytes * peers, messages_each * peers) if nbytes > 0 else NOTHING


def per_step(spans: Iterable[Any], steps: Sequence[int]) -> List[Sent]:
    """What one rank sent in each of the steps named, from its recorded spans: pieces,
    and tensors handed to an engine."""
    index = {step: i for i, step in enumerate(steps)}
    found = [NOTHING] * len(steps)
    for span in spans:
        if span.kind in ("comm", "handed") and span.step in index:
            found[index[span.step]] += Sent(span.sent, span.messages)
    return found


def summarize(sent: List[List[Sent]], images_per_step: int) -> Dict[str, Any]:
    """summary.wire of [rank][step] sends: per rank and step, the mean bytes and
    messages, bytes per image trained, and the share of steps that sent anything, with
    what those steps sent (a periodic strategy's mean step is not its typical step)."""
    every = [s for rank in sent for s in rank]
    busy = [s for s in every if s.nbytes]
    mean_bytes = sum(s.nbytes for s in every) / len(every) if every else 0.0
    return {
        "bytes_per_step": mean_bytes,
        "messages_per_step": sum(s.messages for s in every) / len(every) if every else 0.0,
        "bytes_per_image": mean_bytes / images_per_step,
        "communicating_steps": len(busy) / len(every) if every else 0.0,
        "bytes_per_communicating_step":
            sum(s.nbytes for s in busy) / len(busy) if busy else 0.0,
    }
