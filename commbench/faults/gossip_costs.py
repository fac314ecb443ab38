"""What a failure cost under `--recovery gossip` (commbench.faults.gossip_recovery), in the
shape of the restart and torchft costs: detection, from the failure to the first survivor
that found it; recovery, to the end of rank 0's first exchange among the survivors; a
rejoin (`+REJOIN`), to the end of rank 0's first exchange after the rank was admitted
again (and when its fresh process asked to be admitted); the steps the run took with
fewer workers, until then, and the samples the lost ranks did not learn from in them.
Read from the job's store, where each failing rank recorded when it fired (`fired/R`)
and the first survivor to find it, when (`detected/R`)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from commbench.faults.gossip_survival import PREFIX
from commbench.faults.recovery_hook import goodput_line


def fired(store, rank: int) -> Optional[Dict[str, Any]]:
    """The record rank `rank` wrote as its --fail event fired (None: lost without --fail,
    found silent)."""
    key = f"{PREFIX}/fired/{rank}"
    return json.loads(store.get(key)) if store.check([key]) else None


def fewer(steps: int, failed_after: int, rejoined_at: Optional[int]) -> int:
    """The steps of a run of `steps` that a rank lost after step `failed_after` did not
    take: until it was admitted again after step `rejoined_at`, if it was."""
    return max(0, min(steps, steps if rejoined_at is None else rejoined_at) - failed_after)


def missed(store, meetings: List[Dict[str, Any]], rejoined: Dict[int, List[Any]],
           steps: int) -> int:
    """Of `steps` steps of every worker that started, the steps the lost ranks did not
    take: after the step each fired at (its record), or, found silent without --fail, the
    exchange the survivors resumed at; until it rejoined, if it did."""
    count = 0
    for meeting in meetings:
        for rank in meeting["lost"]:
            record = fired(store, rank)
            last = record["steps"] if record else meeting["resume_step"] - 1
            count += fewer(steps, last, rejoined.get(rank, [None])[0])
    return count


def cost(store, rank: int, meeting: Dict[str, Any], rejoined: Optional[List[Any]],
         steps: int, samples_per_step: int) -> Optional[Dict[str, Any]]:
    """What the failure of `rank` cost (None: lost without --fail)."""
    record = fired(store, rank)
    if record is None:
        return None
    at = record["at"]
    step, back = rejoined or (None, None)
    detected = float(store.get(f"{PREFIX}/detected/{rank}"))
    lost = fewer(steps, record["steps"], step)
    recovered = meeting["recovered_at"]
    asked = f"{PREFIX}/rejoin/{rank}/0"  # when its fresh process asked to be admitted
    asked_at = float(store.get(asked)) if store.check([asked]) else None
    return {"event": record["event"], "rank": rank, "failed_after_step": record["steps"],
            "failed_at": at, "detection_seconds": detected - at,
            "recovery_seconds": None if recovered is None else recovered - at,
            "asked_after_seconds": None if asked_at is None else asked_at - at,
            "rejoin_seconds": None if back is None else back - at,
            "rejoined_at_step": step, "resumed_at_exchange": meeting["resume_step"],
            "steps_with_fewer_workers": lost, "samples_lost": lost * samples_per_step}


def lines(facts: Dict[str, Any], rate: Optional[float], unit: str) -> List[str]:
    """What rank 0 prints of the failures and the goodput, after the outcome."""
    said = []
    for c in facts["costs"]:
        recovered = ("not seen" if c["recovery_seconds"] is None
                     else f"{c['recovery_seconds']:.1f} s after it")
        back = ("" if c.get("rejoin_seconds") is None else
                f"; rejoined {c['rejoin_seconds']:.1f} s after it, at step "
                f"{c['rejoined_at_step']}")
        said.append(f"Failure {c['event']}: detected after {c['detection_seconds']:.1f} s, "
                    f"first exchange among the survivors {recovered}{back}; "
                    f"{c['steps_with_fewer_workers']} steps with fewer workers "
                    f"({c['samples_lost']} {unit} not learnt from)")
    return said + [goodput_line(facts, rate, unit, f", {_survivors(facts)}, failures "
                                "included")]


def _survivors(facts: Dict[str, Any]) -> str:
    count = len(facts.get("survivors", ()))
    return f"{count} survivor{'' if count == 1 else 's'}"
