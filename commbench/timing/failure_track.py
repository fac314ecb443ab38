"""The failures of --fail and their recoveries on the `--timeline` (issue 56): each failure
an instant on a track of the failing rank's (or replica group's) own, and on that track
its costs as spans from the moment it fired: the recovery (to the end of the first
complete step after it), the detection (to when the survivors knew of it: the first to
end the job, or the launcher that did, or the survivors' first step after it ended),
under --recovery restart the restart (to the launcher's start of the job again) and,
where the failing worker came back (torchft's quorum, gossip's admission), the rejoin.
They come from what the result records of each failure (`recovery.costs`: seconds after
`failed_at`, the wall clock when it fired), put on rank 0's clock of the spans; nothing
more is recorded while the job runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

CATEGORY = "failure"
TRACK, TID = "failures and recoveries", 500
# (span name, cost field): a failure's spans, each from the moment it fired.
SPANS = (("recovery: to the first complete step after it", "recovery_seconds"),
         ("detection", "detection_seconds"),
         ("rejoin: training with the others again", "rejoin_seconds"),
         ("restart: the launcher started the job again", "restart_seconds"))


@dataclass(frozen=True)
class Failure:
    """One failure on rank 0's clock of the spans (time.perf_counter seconds)."""

    rank: int  # the failing rank, or replica group under torchft
    event: str  # as --fail spells it: 1@step6:kill
    at: float  # when it fired
    failed_after_step: int
    spans: Tuple[Tuple[str, float], ...]  # (name, seconds after `at`), those recorded

    @property
    def end(self) -> float:
        return self.at + max((seconds for _, seconds in self.spans), default=0.0)


def from_costs(costs: Sequence[Dict[str, Any]], wall_to_clock: float) -> List[Failure]:
    """The failures a result's recovery.costs records (those with no `failed_at`, from
    before it was recorded, cannot be placed and are left out); wall_to_clock: rank 0's
    span clock minus the wall clock."""
    return [Failure(int(c["rank"]), str(c["event"]), c["failed_at"] + wall_to_clock,
                    int(c["failed_after_step"]),
                    tuple((name, float(c[key])) for name, key in SPANS
                          if c.get(key) is not None))
            for c in costs if c.get("failed_at") is not None]


def as_started(survivors: Sequence[int], events: Sequence[Any], offsets: Sequence[float],
               hosts: Sequence[str]) -> Tuple[List[Any], List[float], List[str]]:
    """(events, clock offsets, process names) of the ranks as the job started them, from
    those of the survivors of --recovery gossip (renumbered among themselves: the k-th
    survivor is survivors[k]): a lost rank a process with its failure alone."""
    size = max(survivors) + 1
    events_of, offsets_of = [[] for _ in range(size)], [0.0] * size
    names = [f"rank {r} (lost)" for r in range(size)]
    for k, rank in enumerate(survivors):
        events_of[rank], offsets_of[rank] = events[k], offsets[k]
        names[rank] = f"rank {rank} ({hosts[k]})"
    return events_of, offsets_of, names


def trace_events(failures: Sequence[Failure], origin: float,
                 ranks: int) -> List[Dict[str, Any]]:
    """Chrome trace events of the failures, times in microseconds from `origin`; a
    failing replica group outside the trace's `ranks` gets a process of its own."""
    out: List[Dict[str, Any]] = []
    for rank in sorted({f.rank for f in failures}):
        if rank >= ranks:
            out += [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                     "args": {"name": f"replica group {rank}"}},
                    {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                     "args": {"sort_index": rank}}]
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": TID,
                    "args": {"name": TRACK}})
    for failure in failures:
        ts = (failure.at - origin) * 1e6
        facts = {"event": failure.event, "failed_after_step": failure.failed_after_step}
        out.append({"ph": "i", "s": "t", "name": f"failure {failure.event}", "cat": CATEGORY,
                    "pid": failure.rank, "tid": TID, "ts": ts, "args": facts})
        # the longest first, so that the shorter ones nest in it
        for name, seconds in sorted(failure.spans, key=lambda s: -s[1]):
            out.append({"ph": "X", "name": name, "cat": CATEGORY, "pid": failure.rank,
                        "tid": TID, "ts": ts, "dur": max(0.0, seconds * 1e6),
                        "args": {**facts, "seconds": seconds}})
    return out
