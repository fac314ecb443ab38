"""`compare`'s section on failures (issue 56), for runs trained to accuracy under `--fail`
or a recovery policy: each pair's goodput (useful samples per second of wall time,
failures and recoveries included) beside its throughput during training, arm by arm,
and whether the two arms ran under the same failure schedule. Their times to the target
are compared as measured, each arm under its own schedule: a pair whose schedules differ
says so in its result, so that it is never read as a like-for-like change. Pairs without
failures get nothing here, and `compare`'s output for them is as before."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from commbench.analysis import tables
from commbench.analysis.accuracy import AccuracyRow

HEADERS = ["strategy", "topology", "N", "base failures", "goodput", "in training",
           "a failure", "new failures", "goodput", "in training", "a failure",
           "goodput ratio", "schedules"]
ALIGN = "llrlrrllrrlrl"
NOTE = ("goodput: useful samples per second of wall time, failures and recoveries "
        "included (a recovery policy records it; median over the runs); in training: the "
        "throughput of the training steps alone (mean over the runs); samples are images, "
        "or a language model's tokens; a failure: the median time from a failure to the "
        "first complete step after it, and, where workers came back, until they trained "
        "with the others again. Times to the target above are each arm's under its own "
        "failure schedule.")
DIFFER = "failure schedules differ"


def facts(base: AccuracyRow, new: AccuracyRow) -> Optional[Dict[str, Any]]:
    """A pair's failures, arm by arm; None where neither arm's runs ran under --fail or
    a recovery policy."""
    if not base.failures and not new.failures:
        return None
    before, after = base.goodput, new.goodput
    return {"base": _arm(base), "new": _arm(new),
            "goodput_ratio": None if before is None or after is None else after / before,
            "same_schedule": base.failures == new.failures}


def _arm(row: AccuracyRow) -> Dict[str, Any]:
    return {"failures": row.failures or "none", "goodput": row.goodput, "img_sec": row.img_sec,
            "recovery_seconds": row.median_cost("recovery_seconds"),
            "rejoin_seconds": row.median_cost("rejoin_seconds")}


def differ(pair: Dict[str, Any]) -> bool:
    """Whether a compared pair's arms ran under different failure schedules."""
    return "failures" in pair and not pair["failures"]["same_schedule"]


def lines(pairs: List[Dict[str, Any]], fmt: str) -> List[str]:
    """The section of `compare`'s text output; none where no pair ran under failures."""
    found = [p for p in pairs if "failures" in p]
    if not found:
        return []
    h = "## " if fmt == "markdown" else ""
    out = [f"{h}Under failures (--fail, --recovery)", "",
           f"- {NOTE}" if fmt == "markdown" else NOTE, ""]
    return out + tables.by_group(found, _row, HEADERS, ALIGN, fmt)


def _row(pair: Dict[str, Any]) -> List[str]:
    failures = pair["failures"]
    cells = [pair["strategy"], pair["topology"] or "-", str(pair["workers"])]
    for arm in (failures["base"], failures["new"]):
        cells += [arm["failures"], _number(arm["goodput"], "{:.1f}"),
                  _number(arm["img_sec"], "{:.1f}"), _cost(arm)]
    return cells + [_number(failures["goodput_ratio"], "{:.3f}"),
                    "same" if failures["same_schedule"] else "DIFFER"]


def _cost(arm: Dict[str, Any]) -> str:
    recovery, rejoin = arm.get("recovery_seconds"), arm.get("rejoin_seconds")
    if recovery is None:
        return "-"
    return f"{recovery:.1f} s" + ("" if rejoin is None else f", back after {rejoin:.1f} s")


def _number(value: Optional[float], pattern: str) -> str:
    return "-" if value is None else pattern.format(value)
