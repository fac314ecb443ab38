"""`--recovery gossip` under hierarchical_neighbor_allreduce (issue 56): its survivors go
on around a lost rank as neighbor_allreduce's do (commbench.faults.gossip_recovery), with
a step of the same three stages as commbench.comm.machine_averaging's, each a round of
point-to-point messages that a lost peer cannot hang (one Work per message, waited on
through commbench.faults.gossip_survival.waited):

1. every other surviving rank of a machine sends its parameters to the machine's
   leader (its first surviving rank), which averages them;
2. the leaders mix their machines' averages along the survivors' machine matrix
   (commbench.topology.survivors.survivors_machines: weights scaled by how many ranks
   each machine has left, so that the survivors' mean is kept);
3. each leader sends the result back to its machine's other ranks.

A collective inside the machine would hang on a stopped rank, or fail without naming
the rank it lost. A step is written into the parameters only once its last round
completed, so a loss met in any round leaves this rank's parameters as they were."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Tuple

from commbench.faults.gossip_exchange import Gathering, posted
from commbench.faults.gossip_survival import Meeting, waited
from commbench.timing import wire
from commbench.timing.wire import NOTHING, Sent

if TYPE_CHECKING:  # pragma: no cover
    from commbench.faults.gossip_recovery import Gossip
    from commbench.topology import Schedule

# What carried the bytes inside each machine (the strategy's facts).
INSIDE = "gloo point-to-point"


class Round(NamedTuple):
    """This rank's part of one step, in the job's ranks as started."""

    leader: int
    members: Tuple[int, ...]  # the machine's other surviving ranks
    self_weight: float
    sources: Tuple[Tuple[int, float], ...]  # (leader, weight) of each in-neighbor machine
    destinations: Tuple[int, ...]  # the leader of each out-neighbor machine


class SurvivingMachines(Gathering):
    """The mixer of hierarchical_neighbor_allreduce under --recovery gossip, machines of
    `machine_size` ranks (rank r on machine r // machine_size) along the machines'
    `schedule`; one step per start/finish, as the other mixers."""

    def __init__(self, buffers, schedule: "Schedule", machine_size: int, gossip: "Gossip"):
        self.buffers = list(buffers)
        self.full, self.machine_size, self.gossip = schedule, machine_size, gossip
        gossip.exchange = self  # an admission between steps changes what it mixes
        self.inside = INSIDE
        self.step = self.resume = 0
        self.lost: Tuple[int, ...] = ()
        self._rounds: Dict[int, Round] = {}
        self._received: Dict[Tuple[int, int], object] = {}  # (slot, buffer) -> tensor
        self._messages: Optional[List[Tuple[int, object]]] = None

    def round(self, step: int) -> Round:
        """Who this rank hears from and talks to at `step`, among the ranks not lost."""
        from commbench.topology.survivors import survivors_machines

        phase = step % self.full.period
        if phase not in self._rounds:
            machines, weights = survivors_machines(self.full.at(phase).weights,
                                                   self.machine_size, self.lost)
            mine = next(a for a, ranks in enumerate(machines) if self.gossip.me in ranks)
            leaders = [ranks[0] for ranks in machines]
            self._rounds[phase] = Round(
                leaders[mine], tuple(machines[mine][1:]), float(weights[mine, mine]),
                tuple((leaders[b], float(w)) for b, w in enumerate(weights[mine])
                      if w and b != mine),
                tuple(leaders[a] for a, w in enumerate(weights[:, mine]) if w and a != mine))
        return self._rounds[phase]

    def leads(self, plan: Round) -> bool:
        return plan.leader == self.gossip.me

    def start(self) -> None:
        """The first round: the machine's ranks' parameters to its leader."""
        if self.step < self.resume:  # before the exchange the survivors resume at
            self._messages = None
            return
        plan = self.round(self.step)
        if self.leads(plan):
            self._messages = self._post("recv", [(peer, self._slot(slot)) for slot, peer
                                                 in enumerate(plan.members)])
        else:
            self._messages = self._post("send", [(plan.leader, self.buffers)])

    def finish(self) -> None:
        messages, self._messages = self._messages, None
        if messages is not None and self._rounds_after(messages):
            self.gossip.exchanged()
        self.step += 1

    def _rounds_after(self, messages) -> bool:
        """The rest of the step once the first round's messages are posted; False where a
        loss was met (and the survivors met about it)."""
        import torch

        plan = self.round(self.step)
        if not self._done(messages):
            return False
        if not self.leads(plan):  # its leader's result, into the parameters once whole
            result = [self._slot(0, k) for k in range(len(self.buffers))]
            if not self._done(self._post("recv", [(plan.leader, result)], tag=2)):
                return False
            for x, r in zip(self.buffers, result):
                x.copy_(r)
            return True
        average = [x.clone() for x in self.buffers]
        for slot in range(len(plan.members)):
            for total, part in zip(average, self._slot(slot)):
                total.add_(part)
        for total in average:
            total.div_(1 + len(plan.members))
        firsts = len(plan.members)  # the second round's slots follow the first's
        exchange = self._post("send", [(peer, average) for peer in plan.destinations], tag=1)
        exchange += self._post("recv", [(peer, self._slot(firsts + slot)) for slot, (peer, _)
                                        in enumerate(plan.sources)], tag=1)
        if not self._done(exchange):
            return False
        result = [torch.mul(a, plan.self_weight) for a in average]
        for slot, (_, weight) in enumerate(plan.sources):
            for r, part in zip(result, self._slot(firsts + slot)):
                r.add_(part, alpha=weight)
        if not self._done(self._post("send", [(peer, result) for peer in plan.members], tag=2)):
            return False
        for x, r in zip(self.buffers, result):
            x.copy_(r)
        return True

    def _post(self, kind: str, to: List[Tuple[int, list]], tag: int = 0):
        """(started rank, Work) of each buffer sent to or received from each peer; tags
        tell the rounds and buffers apart."""
        group = self.gossip.survivors
        return [(peer, posted(kind, tensor, group.index(peer), tag * len(self.buffers) + k))
                for peer, tensors in to for k, tensor in enumerate(tensors)]

    def _done(self, messages) -> bool:
        """Wait for `messages`; on a loss (found here or announced) meet the survivors."""
        ended = waited(messages, self.gossip.survival)
        if ended.lost or ended.news:
            self.mix_among(self.gossip.lost(self.step, ended.lost))
            return False
        return True

    def _slot(self, slot: int, k: Optional[int] = None):
        """Receive buffers, kept between steps: slot's copy of every buffer (or of one)."""
        import torch

        for j, b in enumerate(self.buffers):
            if (slot, j) not in self._received:
                self._received[slot, j] = torch.empty_like(b)
        if k is not None:
            return self._received[slot, k]
        return [self._received[slot, j] for j in range(len(self.buffers))]

    def mix_among(self, met: Meeting) -> None:
        """Mix among the members `met` settled, from its resume step, with the ranks still
        lost bypassed (none once all are back)."""
        self.lost, self._rounds = tuple(met.lost), {}
        self.resume = met.resume_step

    def peers(self) -> None:
        return None  # the timeline's ranks as the job started them; a loss renumbers them

    def piece_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def wire(self) -> Sent:
        """This step's sends: a leader's average to each out-neighbor machine and its
        result to each of its machine's ranks; any other rank its parameters, once."""
        if self.step < self.resume:
            return NOTHING  # skipped: the survivors resume after it
        plan = self.round(self.step)
        nbytes, count = self.piece_bytes(), len(self.buffers)
        if not self.leads(plan):
            return wire.to_each(nbytes, 1, count)
        peers = len(plan.destinations) + len(plan.members)
        return wire.to_each(nbytes, peers, count) if peers else NOTHING

    def moves_alone(self) -> bool:
        """Only the first round is posted in start(); the others begin in finish()."""
        return False
