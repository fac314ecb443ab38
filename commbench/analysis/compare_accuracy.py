"""`compare`'s part for runs trained to accuracy: the two arms' rows matched on
configuration (group key without hardware and tag, strategy, workers), their times to
the target side by side, and whether the difference is real; where the runs ran under
failures, their goodput beside their throughput (commbench.analysis.compare_failures).

The test is the Mann-Whitney U test on the runs' times to the target, two-sided, exact
for small arms (commbench.analysis.time_to_target): it needs no normal distribution and
ranks a run that missed the target as slower than every run that reached it. With few
runs no outcome can be significant (3 against 3: p >= 0.1); the row then says "not
enough runs" rather than "no difference".
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from commbench.analysis import compare_failures, tables
from commbench.analysis import time_to_target as ttt
from commbench.analysis.accuracy import AccuracyRow, AccuracyRun, rows_by_match
from commbench.analysis.runs import given

TEST = ("Mann-Whitney U test on the runs' training times to the target, two-sided, exact "
        "for small arms; a run that missed the target ranks slowest")
HEADERS = ["strategy", "topology", "N", "base median s", "reached", "new median s", "reached",
           "ratio", "delta", "p", "result"]
ALIGN = "llrrrrrrrrl"


def _order(match_key: Tuple) -> Tuple:
    group, series, workers = match_key
    return (group, series.order(), workers)


def title(matching: Tuple) -> str:
    (model, data, partition, batch, image, target, every, budget, training, precision,
     device, backend, network, stragglers) = matching
    parts = [model, data, f"partition {partition}", f"batch {batch} per worker",
             f"sequences of {image} tokens" if data.startswith("language:")
             else f"{image}x{image} images", f"target {target}" if target else "no target",
             f"evaluated every {every} steps", f"budget {budget}", training, precision,
             device, backend]
    return ", ".join(parts + given(network, stragglers))


class AccuracyComparison:
    def __init__(self, base: List[AccuracyRun], new: List[AccuracyRun], threshold: float,
                 alpha: float):
        self.threshold, self.alpha = threshold, alpha
        a, b = rows_by_match(base), rows_by_match(new)
        self.pairs = [self._pair(k, a[k], b[k]) for k in sorted(set(a) & set(b), key=_order)]
        self.only_base = [(k, a[k]) for k in sorted(set(a) - set(b), key=_order)]
        self.only_new = [(k, b[k]) for k in sorted(set(b) - set(a), key=_order)]
        self.regressions = [p for p in self.pairs if p["result"] == "SLOWER"]

    def _pair(self, key: Tuple, base: AccuracyRow, new: AccuracyRow) -> Dict[str, Any]:
        before, after = base.median_of("time"), new.median_of("time")
        ratio = None if before is None or after is None else after / before
        # accuracy_reading.read refuses a time that is not finite: every time ranks
        p = ttt.mann_whitney_p(base.times(), new.times()) if base.has_target else None
        pair = {"group": title(key[0]), "strategy": base.series.strategy,
                "topology": base.series.settings(), "workers": base.workers,
                "base": base, "new": new, "ratio": ratio,
                "delta": None if ratio is None else ratio - 1, "p": p,
                "result": self._verdict(base, new, ratio, p)}
        failures = compare_failures.facts(base, new)
        if failures is not None:  # only then: a pair without failures reads as before
            pair["failures"] = failures
        return pair

    def _verdict(self, base: AccuracyRow, new: AccuracyRow, ratio: Optional[float],
                 p: Optional[float]) -> str:
        if not base.has_target:
            return "n/a: no target"
        if base.reached == 0 and new.reached == 0:
            return "n/a: neither arm reached the target"
        if ttt.smallest_p(len(base.runs), len(new.runs)) >= self.alpha:
            return f"not enough runs ({len(base.runs)} vs {len(new.runs)})"
        if p is None or p >= self.alpha:
            return "~ (not significant)"
        if ratio is not None and abs(ratio - 1) < self.threshold:
            return f"~ (below {100 * self.threshold:g}%)"
        # the direction from the ranks: a missed run has no time, but it is the slowest
        slower = _mean_rank_of_new(base.times(), new.times()) > (len(base.runs) + len(
            new.runs) + 1) / 2
        return "SLOWER" if slower else "faster"

    def lines(self, fmt: str) -> List[str]:
        """The section of `compare`'s text output."""
        h = "## " if fmt == "markdown" else ""
        test = (f"Test: {TEST}, alpha {self.alpha:g}; changed = significant and |delta| >= "
                f"{100 * self.threshold:g}% (delta of the median times; lower is faster).")
        lines = [f"{h}Time to accuracy", "", f"- {test}" if fmt == "markdown" else test, ""]
        lines += tables.by_group(self.pairs, _row, HEADERS, ALIGN, fmt)
        if not self.pairs:
            lines += ["No configuration trained to accuracy is in both BASE and NEW.", ""]
        lines += compare_failures.lines(self.pairs, fmt)
        for name, cells in (("Only in BASE", self.only_base), ("Only in NEW", self.only_new)):
            if cells:
                lines += [f"{h}{name}, trained to accuracy (not compared):"]
                lines += _unmatched(cells, fmt) + [""]
        return lines

    def summary(self) -> str:
        counts = {r: sum(p["result"] == r for p in self.pairs) for r in ("faster", "SLOWER")}
        short = sum(p["result"].startswith("not enough") for p in self.pairs)
        differ = sum(compare_failures.differ(p) for p in self.pairs)
        return (f"Time to accuracy: {len(self.pairs)} compared: {counts['faster']} faster, "
                f"{counts['SLOWER']} slower, {short} with not enough runs, "
                f"{len(self.pairs) - sum(counts.values()) - short} unchanged or undecided; "
                f"{len(self.only_base) + len(self.only_new)} unmatched"
                + (f"; {differ} under different failure schedules." if differ else "."))

    def record(self) -> Dict[str, Any]:
        def row(r: AccuracyRow) -> Dict[str, Any]:
            return {"median_time_to_target_s": r.median_of("time"),
                    "reached": r.reached if r.has_target else None,
                    "runs": len(r.runs), "times_to_target_s": r.times(),
                    "files": [str(run.path) for run in r.runs]}

        def unmatched(cell) -> Dict[str, Any]:
            key, r = cell
            return dict(row(r), group=title(key[0]), strategy=r.series.strategy,
                        topology=r.series.settings(), workers=r.workers)

        return {"test": TEST, "pairs": [dict(p, base=row(p["base"]), new=row(p["new"]))
                                        for p in self.pairs],
                "only_in_base": [unmatched(c) for c in self.only_base],
                "only_in_new": [unmatched(c) for c in self.only_new]}


def _mean_rank_of_new(base, new) -> float:
    pooled = ttt.ordered(base) + ttt.ordered(new)
    ranks = ttt.mid_ranks(pooled)
    return sum(ranks[len(base):]) / len(new)


def _median(row: AccuracyRow) -> str:
    value = row.median_of("time")
    return "-" if value is None else f"{value:.2f}"


def _reached(row: AccuracyRow) -> str:
    """Runs that reached the target / runs; "-" for runs trained without a target (none
    of them "missed" it)."""
    return f"{row.reached}/{len(row.runs)}" if row.has_target else "-"


def _row(p: Dict[str, Any]) -> List[str]:
    base, new = p["base"], p["new"]
    return [p["strategy"], p["topology"] or "-", str(p["workers"]), _median(base),
            _reached(base), _median(new), _reached(new),
            "-" if p["ratio"] is None else f"{p['ratio']:.3f}",
            "-" if p["delta"] is None else f"{100 * p['delta']:+.1f}%",
            "-" if p["p"] is None else f"{p['p']:.3g}",
            p["result"] + (f"; {compare_failures.DIFFER}" if compare_failures.differ(p) else "")]


def _unmatched(cells, fmt: str) -> List[str]:
    lines, group = [], None
    for key, row in cells:
        name = title(key[0])
        if name != group:
            group = name
            lines.append(f"- {name}" if fmt == "markdown" else f"  {name}")
        files = ", ".join(str(r.path) for r in row.runs)
        lines.append(f"{'  - ' if fmt == 'markdown' else '    '}{row.series.label()}, "
                     f"N={row.workers}: " + (f"median {_median(row)} s, {_reached(row)} reached"
                                             if row.has_target else
                                             f"no target, {len(row.runs)} run(s)")
                     + f" ({files})")
    return lines
