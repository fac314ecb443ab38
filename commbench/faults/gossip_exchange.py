"""`--recovery gossip`'s neighbor exchange (commbench.faults.gossip_recovery): one Work
per message, waited on through commbench.faults.gossip_survival.waited, so that a lost
peer cannot hang it; on a loss the survivors meet and it mixes along their own schedule
(commbench.topology.survivors) from the exchange they agreed on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Tuple

from commbench.comm.neighbor_exchange import NeighborExchange
from commbench.faults.gossip_survival import Meeting, waited

if TYPE_CHECKING:  # pragma: no cover
    from commbench.faults.gossip_recovery import Gossip


class Gathering:
    """What gossip's mixers (this one and commbench.faults.gossip_machines') do between
    steps; `gossip` and `step` are theirs."""

    def gather(self, why: str = "evaluation") -> None:
        """Before the evaluation's collectives or an admission: every member here, or a
        loss met."""
        met = self.gossip.gathered(self.step - 1, why)
        if met is not None:
            self.mix_among(met)


class SurvivingExchange(Gathering, NeighborExchange):
    """A neighbor exchange over gloo whose wait a lost peer cannot hang: each message
    is its own Work, waited on through gossip_survival.waited; on a loss the survivors
    meet (Gossip.lost) and mix along their own schedule from the exchange they agreed
    on, the exchanges before it skipped (this rank's parameters left as they are)."""

    def __init__(self, buffers, schedule, node: int, gossip: "Gossip", narrow=None):
        super().__init__(buffers, schedule, node, narrow=narrow, transport="gloo")
        self.full, self.gossip = schedule, gossip
        gossip.exchange = self  # an admission between steps changes what it mixes
        self.resume = 0
        self.messages: List[Tuple[int, Any]] = []

    def start(self) -> None:
        if self.step < self.resume:
            self._pending = (None, [])
            return
        super().start()

    def finish(self) -> None:
        if self._pending is not None and self._pending[0] is None:  # skipped
            self._pending = None
            self.step += 1
            return
        ended = waited(self.messages, self.gossip.survival)
        if ended.lost or ended.news:
            self._pending = None
            self.mix_among(self.gossip.lost(self.step, ended.lost))
            self.step += 1
            return
        super().finish()
        self.gossip.exchanged()

    def wire(self):
        """This step's sends; none in a step skipped before the one the survivors resume at."""
        from commbench.timing.wire import NOTHING

        return NOTHING if self.step < self.resume else super().wire()

    def peers(self) -> None:
        """Every rank: the timeline's pieces from before a loss would name peers in the
        numbering of a group that is gone."""
        return None

    def mix_among(self, met: Meeting) -> None:
        """Mix among the members `met` settled, from its resume step: along the
        survivors' schedule of the ranks still lost, or the full one once all are back."""
        from commbench.topology.survivors import survivors_schedule

        self.schedule = survivors_schedule(self.full, met.lost) if met.lost else self.full
        self.node = self.gossip.survivors.index(self.gossip.me)
        self.ranks = list(range(len(self.gossip.survivors)))
        self._plans, self._received = {}, {}
        self.resume = met.resume_step

    @property
    def transport(self):
        return self

    @transport.setter
    def transport(self, value) -> None:
        pass  # always its own post: one Work per message

    def post(self, chunks: List[list]) -> list:
        """Each message on its own, remembered with its peer (as the job started)."""
        from commbench.comm.transport import Handle

        self.messages = [(self.gossip.survivors[peer], posted(kind, tensor, peer, tag))
                         for messages in chunks for kind, tensor, peer, tag in messages]
        return [Handle(lambda: None) for _ in chunks]


def posted(kind: str, tensor, peer: int, tag: int):
    """The Work of a message ("send" or "recv") posted to `peer`; where gloo refuses it
    as it is posted (the peer's connection closed already), one whose wait fails."""
    import torch.distributed as dist

    try:
        return (dist.irecv if kind == "recv" else dist.isend)(tensor, peer, tag=tag)
    except RuntimeError as closed:
        return _Failed(closed)


class _Failed:
    """The Work of a message gloo refused as it was posted: its wait fails alike."""

    def __init__(self, error: RuntimeError):
        self.error = error

    def wait(self, timeout=None) -> None:
        raise self.error
