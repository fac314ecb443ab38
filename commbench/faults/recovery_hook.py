"""The loop's side of a recovery policy (commbench.faults.recovery): what the loop of a
run trained to accuracy (commbench.job.accuracy_loop) asks of it at every step, and
what the job asks once training ended. `Recovery` itself is a run without a policy,
which the first failure ends: nothing to resume, heal, miss or report. Each policy
answers for itself: commbench.faults.restart's Restart, commbench.faults.torchft_group's
Replica, commbench.faults.gossip_recovery's Gossip."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional


@dataclass
class Progress:
    """Where training stands: what a checkpoint saves, a restart resumes and a peer
    that heals takes up."""

    steps: int = 0
    training_seconds: float = 0.0
    wall_seconds: float = 0.0
    # the evaluations' points: the loop's Points, dicts once serialized (asdict turns them)
    curve: List[Any] = field(default_factory=list)
    losses: List[float] = field(default_factory=list)  # since the last evaluation
    # this rank's bytes on the wire since the job first started, a restarted job's
    # earlier attempts included (commbench.faults.restart)
    bytes_sent: int = 0


class Recovery:
    """No recovery policy: every step counts, and the job ends at a failure."""

    def __init__(self) -> None:
        self.start = Progress()

    def begin(self, fails, model, optimizer, next_batch: Callable[[], Any]) -> Progress:
        """Every rank, before the first step: where training starts (fails: the
        --fail injector, whose events the policy records as they fire)."""
        return self.start

    def healed(self) -> Optional[Progress]:
        """Where training stands at the end of a step in which this rank took a peer's
        state, or None."""
        return None

    def committed(self) -> bool:
        """Whether the last step changed the model."""
        return True

    def after_step(self, progress: Progress) -> None:
        """After each step that counts (and its evaluation): where training stands."""

    def agreed(self, steps: int, stopped_by: Optional[str]) -> Optional[str]:
        """Every rank, after the evaluation at `steps`: why training stops there (None:
        it goes on), as every worker of the job must agree."""
        return stopped_by

    def samples_missed(self, steps: int) -> int:
        """Of `steps` steps of every worker that started, the samples no worker learnt
        from (a lost rank's, after it failed)."""
        return 0

    def ended(self, steps: int, model) -> bool:
        """Every rank, at its run's end: whether its result is written (rank 0's is)."""
        return True

    def facts(self, outcome: Dict[str, Any], model) -> Optional[Dict[str, Any]]:
        """Rank 0, once training ended: what the failures cost (None: no policy)."""
        return None

    def lines(self, facts: Optional[Dict[str, Any]], rate: Optional[float],
              unit: str) -> List[str]:
        """What rank 0 prints of `facts` after the outcome (rate: the failure-free
        throughput during training, in `unit`/sec)."""
        return []

    def leave(self) -> None:
        """Once the result is told: anything the policy must do before the process ends."""


def goodput_line(facts: Dict[str, Any], rate: Optional[float], unit: str, over: str) -> str:
    """The run's goodput beside its failure-free throughput; `over`: what the wall time
    includes."""
    plain = f" (during training: {rate:.1f})" if rate else ""
    return (f"Goodput: {facts['goodput']:.1f} {unit}/sec over {facts['wall_seconds']:.1f} s "
            f"of wall time{over}{plain}")
