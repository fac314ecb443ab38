"""What each failure cost under `--recovery torchft` (commbench.faults.torchft_group),
from two records: the failing replica group's, written as it fires its event (when, after
how many steps), and replica group 0's log of its own steps (when each ended, how many
replica groups its quorum held, whether it committed). When it fired (`failed_at`, on
the wall clock) places it on the timeline (commbench.timing.failure_track).

Survivors do not redo steps: they go on with fewer replica groups, or wait for the
quorum to re-form. The failing group's last step is the quorum's step number it had
committed when it fired; every step of group 0 after that one needed a quorum that knew
of the failure. So a failure costs
- detection: from the failure to the end of the survivors' first step after it (its
  allreduce cut off, or its quorum re-formed without the lost group or with it healed);
- recovery: from the failure to the end of the survivors' first committed step after it
  (issue 56's target: 5 s on CPU), waiting for the quorum included;
- rejoin: from the failure to the end of the first committed step with as many groups
  as before it, the restarted group back from a peer's state (target: 30 s), or None;
- training steps taken by fewer groups (H for each such sync), and the samples the
  missing groups did not learn from in them (batch size for each missing group in
  each such training step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from commbench.faults.recovery_hook import goodput_line


@dataclass(frozen=True)
class StepRecord:
    """One of replica group 0's quorum steps: when it ended (wall clock), the quorum's
    step number after it, its quorum's size, whether it committed."""

    ended: float
    step: int
    participants: int
    committed: bool


def cost(fired: Dict[str, Any], log: Sequence[StepRecord], batch: int,
         every: int = 1) -> Dict[str, Any]:
    """What one fired event cost, from replica group 0's log (fired: the failing group's
    record, {"event", "rank", "steps", "at", "quorum_step"}: the steps its loop counted,
    the quorum's step number it had committed; a group that healed from a peer counts
    the peer's steps from then on, but only the quorum's number is group 0's too), each
    quorum step of which stands for `every` training steps."""
    at, last = fired["at"], fired["quorum_step"]
    before = [i for i, s in enumerate(log) if s.committed and s.step <= last]
    full = log[before[-1]].participants if before else max(
        (s.participants for s in log), default=0)
    # A group that lagged fires behind group 0's step number: a step that ended before
    # the failure is never one after it.
    after = [s for s in (log[before[-1] + 1:] if before else log) if s.ended > at]
    noticed = after[0] if after else None
    recovered = next((s for s in after if s.committed), None)
    rejoined = next((s for s in after if s.committed and s.participants >= full), None)
    fewer = [s for s in after if s.committed and s.participants < full
             and (rejoined is None or s.ended < rejoined.ended)]
    return {"event": fired["event"], "rank": fired["rank"],
            "failed_after_step": fired["steps"], "failed_at": at,
            "detection_seconds": _since(at, noticed),
            "recovery_seconds": _since(at, recovered),
            "rejoin_seconds": _since(at, rejoined),
            "steps_with_fewer_groups": len(fewer) * every,
            "samples_lost": sum(full - s.participants for s in fewer) * batch * every}


def short_quorums(fired: Sequence[Dict[str, Any]], log: Sequence[StepRecord],
                  groups: int) -> int:
    """Committed steps before the first failure whose quorum held fewer than all the
    replica groups: a group that fell behind healing from a peer. Where there are any,
    quorum sizes tell failures from lag less well, and the costs say so."""
    first = min((f["at"] for f in fired), default=float("inf"))
    return sum(1 for s in log if s.committed and s.ended <= first and s.participants < groups)


def _since(at: float, step: Optional[StepRecord]) -> Optional[float]:
    return None if step is None else step.ended - at


def lines(facts: Dict[str, Any], rate: Optional[float], unit: str) -> List[str]:
    """What replica group 0 prints of the failures and the goodput, after the outcome."""
    said = []
    for c in facts["costs"]:
        times = ", ".join(f"{what} {_after(c[key])}" for what, key in (
            ("detected", "detection_seconds"),
            ("first complete step after it", "recovery_seconds"),
            ("back in the quorum", "rejoin_seconds")))
        said.append(f"Failure {c['event']}: {times}; {c['steps_with_fewer_groups']} steps "
                    f"with fewer replica groups ({c['samples_lost']} {unit} not learnt from)")
    short = facts.get("short_quorums_before_failures", 0)
    if short and facts["costs"]:
        said.append(f"  (not exact: {short} steps before the first failure had a quorum of "
                    f"fewer than {facts['replica_groups']} replica groups, groups falling "
                    "behind and healing; the costs above count quorum sizes)")
    return said + [goodput_line(facts, rate, unit, f", {facts['replica_groups']} replica "
                                "groups, failures included")]


def _after(value: Optional[float]) -> str:
    return "not seen" if value is None else f"after {value:.1f} s"
