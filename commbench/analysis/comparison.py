"""The comparison of two arms of results for `commbench compare`: runs paired on
configuration (group key without hardware and tag, strategy and topology settings,
workers), the statistics of each pair, and the whole as text, Markdown or JSON.

Whether a difference is real is Welch's t-test on the per-iteration totals S_i of
the two arms (repeats pooled); a configuration has "changed" when p < alpha and
|delta| >= threshold. Runs trained to accuracy are compared on their times to the
target (commbench.analysis.compare_accuracy). Unmatched runs are listed, then the
environment keys and run settings in which the arms differ.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Tuple

from commbench.result import metrics
from commbench.analysis import accuracy, grouping
from commbench.analysis import tables
from commbench.analysis.compare_accuracy import AccuracyComparison
from commbench.analysis.runs import Point, Run, given
from commbench.job.language_models import LANGUAGE_MODELS
from commbench.result.store import to_json

TEST = "Welch's t-test on per-iteration total img/sec (S_i), two-sided"
HEADERS = ["strategy", "topology", "N", "base img/sec", "new img/sec", "ratio", "delta",
           "p", "result"]
ALIGN = "llrrrrrrl"
# Settings that are part of the match, or that differ without meaning anything.
MATCHED_SETTINGS = {"model", "batch_size", "image_size", "num_classes", "fp16_allreduce", "amp",
                    "dist_optimizer", "topology", "disable_dynamic_topology", "atc_style",
                    "results_dir"}


def _cells(runs: List[Run]) -> Dict[Tuple, Point]:
    by_key: Dict[Tuple, List[Run]] = {}
    for run in runs:
        by_key.setdefault(run.match_key, []).append(run)
    return {k: grouping.combine(sorted(v, key=lambda r: str(r.path))) for k, v in by_key.items()}


def _order(match_key: Tuple) -> Tuple:
    group, series, workers = match_key
    return (group, series.order(), workers)


class Comparison:
    def __init__(self, base: List[Run], new: List[Run], threshold: float, alpha: float,
                 base_trained: Optional[List[accuracy.AccuracyRun]] = None,
                 new_trained: Optional[List[accuracy.AccuracyRun]] = None):
        self.base_runs, self.new_runs = base, new
        self.base_trained, self.new_trained = base_trained or [], new_trained or []
        self.threshold, self.alpha = threshold, alpha
        a, b = _cells(base), _cells(new)
        self.pairs = [self._pair(k, a[k], b[k]) for k in sorted(set(a) & set(b), key=_order)]
        self.only_base = [a[k] for k in sorted(set(a) - set(b), key=_order)]
        self.only_new = [b[k] for k in sorted(set(b) - set(a), key=_order)]
        self.speed = bool(base or new)  # the img/sec part: absent when the arms have no run
        self.accuracy = AccuracyComparison(self.base_trained, self.new_trained, threshold,
                                           alpha) if self.base_trained or self.new_trained \
            else None
        self.regressions = [p for p in self.pairs if p["result"].startswith("SLOWER")] + \
            (self.accuracy.regressions if self.accuracy else [])

    def _pair(self, key: Tuple, base: Point, new: Point) -> Dict[str, Any]:
        ratio = new.total / base.total if base.total else math.nan
        unknown = not_finite(base, new)
        p = None if unknown else metrics.welch_p_value(base.totals, new.totals)
        if unknown:  # NaN fails every test: it would read as "not significant"
            result = f"n/a: cannot compare ({unknown})"
        elif p is None:
            result = "n/a: < 2 iterations"
        elif p < self.alpha and abs(ratio - 1) >= self.threshold:
            result = "faster" if ratio > 1 else "SLOWER"
        elif p < self.alpha:
            result = f"~ (below {100 * self.threshold:g}%)"
        else:
            result = "~ (not significant)"
        diverged = "/".join(arm for arm, point in (("BASE", base), ("NEW", new))
                            if point.diverged)
        if diverged:  # its img/sec stand, but the run it timed did not train
            result += f" (loss diverged in {diverged})"
        return {"group": _title(key[0]), "strategy": base.series.strategy,
                "topology": base.series.settings(), "workers": base.workers,
                "base": base, "new": new, "ratio": ratio, "delta": ratio - 1, "p": p,
                "result": result}

    def _docs(self, arm: str) -> List[Dict[str, Any]]:
        if arm == "base":
            return [r.doc for r in self.base_runs] + [r.doc for r in self.base_trained]
        return [r.doc for r in self.new_runs] + [r.doc for r in self.new_trained]

    def environment_differences(self) -> List[Tuple[str, List[str], List[str]]]:
        return _differences([d.get("environment") or {} for d in self._docs("base")],
                            [d.get("environment") or {} for d in self._docs("new")])

    def setting_differences(self) -> List[Tuple[str, List[str], List[str]]]:
        def settings(docs):
            return [{k: v for k, v in d["config"].items() if k not in MATCHED_SETTINGS}
                    for d in docs]
        return _differences(settings(self._docs("base")), settings(self._docs("new")))

    def text(self, base: str, new: str, fmt: str) -> str:
        h = "## " if fmt == "markdown" else ""
        lines = [f"BASE: {base} ({_arm(len(self.base_runs), len(self.base_trained))})",
                 f"NEW:  {new} ({_arm(len(self.new_runs), len(self.new_trained))})"]
        if self.speed:
            lines += [f"Test: {_test(self.base_runs + self.new_runs)}, alpha {self.alpha:g}; "
                      f"changed = significant and "
                      f"|delta| >= {100 * self.threshold:g}%."]
        lines += [""]
        if fmt == "markdown":
            lines = [f"- {line}" if line else line for line in lines]
        if self.speed:
            lines += self._speed_lines(fmt)
        if self.accuracy:
            lines += self.accuracy.lines(fmt)
        bullet = "- " if fmt == "markdown" else "  "
        for title, diffs in (("Environment differences", self.environment_differences()),
                             ("Run settings that differ", self.setting_differences())):
            lines += [f"{h}{title} (BASE -> NEW; a | b: the arm's runs differ):"]
            lines += [f"{bullet}{k}: {' | '.join(a)} -> {' | '.join(b)}"
                      for k, a, b in diffs] or [f"{bullet}none"]
            lines += [""]
        counts = {r: sum(p["result"].startswith(r) for p in self.pairs)
                  for r in ("faster", "SLOWER")}
        if self.speed:
            lines += [f"{len(self.pairs)} compared: {counts['faster']} faster, "
                      f"{counts['SLOWER']} slower, "
                      f"{len(self.pairs) - sum(counts.values())} unchanged or undecided; "
                      f"{len(self.only_base) + len(self.only_new)} unmatched."]
        if self.accuracy:
            lines += [self.accuracy.summary()]
        return "\n".join(lines) + "\n"

    def _speed_lines(self, fmt: str) -> List[str]:
        h = "## " if fmt == "markdown" else ""
        lines: List[str] = []
        for group in dict.fromkeys(p["group"] for p in self.pairs):
            own = [p for p in self.pairs if p["group"] == group]
            lines += tables.by_group(own, _row, _headers(own[0]["base"]), ALIGN, fmt)
        if not self.pairs:
            lines += ["No configuration is in both BASE and NEW.", ""]
        for title, cells in (("Only in BASE", self.only_base), ("Only in NEW", self.only_new)):
            if cells:
                lines += [f"{h}{title} (not compared):"] + _unmatched_lines(cells, fmt) + [""]
        return lines

    def json(self) -> str:
        def point(c: Point) -> Dict[str, Any]:
            # total_img_sec keeps its name (the result schema's); a language model's
            # counts tokens, and says so
            unit = {"unit": "tokens"} if _rate(c) == "tokens/sec" else {}
            return {"total_img_sec": c.total, "ci95": c.ci, **unit,
                    "runs": [str(r.path) for r in c.runs]}

        def unmatched(c: Point) -> Dict[str, Any]:
            return dict(point(c), group=_title(c.runs[0].key.matching()),
                        strategy=c.series.strategy, topology=c.series.settings(),
                        workers=c.workers)

        doc = {"test": _test(self.base_runs + self.new_runs), "alpha": self.alpha,
               "threshold": self.threshold,
               "pairs": [dict(p, base=point(p["base"]), new=point(p["new"]))
                         for p in self.pairs],
               "only_in_base": [unmatched(c) for c in self.only_base],
               "only_in_new": [unmatched(c) for c in self.only_new],
               "environment_differences": {k: [a, b] for k, a, b in
                                           self.environment_differences()},
               "setting_differences": {k: [a, b] for k, a, b in self.setting_differences()}}
        if self.accuracy:
            doc["accuracy"] = self.accuracy.record()
        return to_json(doc, indent=1) + "\n"


def not_finite(base: Point, new: Point) -> str:
    """What makes a pair's numbers unusable for a test, or "" when nothing does."""
    for arm, point in (("BASE", base), ("NEW", new)):
        if not (math.isfinite(point.total) and point.total > 0):
            return f"{arm}'s {_rate(point)} is {point.total:g}"
        if not all(math.isfinite(v) for v in point.totals):
            return f"{arm}'s per-iteration {_rate(point)} are not all finite"
    return ""


def _rate(point: Point) -> str:
    """The point's throughput in the unit its runs counted: img/sec or tokens/sec."""
    return metrics.rate_name(point.runs[0].doc["summary"])


def _headers(point: Point) -> List[str]:
    return [h.replace("img/sec", _rate(point)) for h in HEADERS]


def _test(runs: List[Run]) -> str:
    """The test, named in the units the arms' runs counted (img/sec alone: TEST)."""
    rates = dict.fromkeys(metrics.rate_name(r.doc["summary"]) for r in runs)
    return TEST.replace("img/sec", " or ".join(rates)) if rates else TEST


def _runs(count: int) -> str:
    return f"{count} run{'s' if count != 1 else ''}"


def _arm(runs: int, trained: int) -> str:
    return _runs(runs) + (f", {trained} trained to accuracy" if trained else "")


def _title(matching: Tuple) -> str:
    model, batch, image, classes, precision, device, backend, network, stragglers = matching
    if model in LANGUAGE_MODELS:  # its classes are its vocabulary: not shown
        parts = [model, f"batch {batch} per worker", f"sequences of {image} tokens"]
    else:
        parts = [model, f"batch {batch} per worker", f"{image}x{image} images"]
        parts += [f"{classes} classes"] if classes != 1000 else []
    parts += [precision, device, backend]
    return ", ".join(parts + given(network, stragglers))


def _row(p: Dict[str, Any]) -> List[str]:
    base, new = p["base"], p["new"]
    return [p["strategy"], p["topology"] or "-", str(p["workers"]), _total(base), _total(new),
            f"{p['ratio']:.3f}", f"{100 * p['delta']:+.1f}%",
            "-" if p["p"] is None else f"{p['p']:.3g}", p["result"]]


def _total(c: Point) -> str:
    return f"{c.total:.1f}" + ("" if c.ci is None else f" +- {c.ci:.1f}")


def _unmatched_lines(cells: List[Point], fmt: str) -> List[str]:
    """Under each group's title: strategy, workers, throughput and the files."""
    lines, group = [], None
    for c in cells:
        title = _title(c.runs[0].key.matching())
        if title != group:
            group = title
            lines.append(f"- {title}" if fmt == "markdown" else f"  {title}")
        files = ", ".join(str(r.path) for r in c.runs)
        lines.append(f"{'  - ' if fmt == 'markdown' else '    '}{c.series.label()}, "
                     f"N={c.workers}: {c.total:.1f} {_rate(c)} ({files})")
    return lines


def _differences(base: List[Dict[str, Any]], new: List[Dict[str, Any]]):
    """Keys (dotted for nested dicts) whose sets of values differ between the arms."""
    a, b = _values(base), _values(new)
    return [(k, a.get(k, ["(absent)"]), b.get(k, ["(absent)"])) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def _values(docs: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    values: Dict[str, set] = {}
    for doc in docs:
        for key, value in _flatten(doc):
            values.setdefault(key, set()).add(
                value if isinstance(value, str) and value else json.dumps(value))
    return {k: sorted(v) for k, v in values.items()}


def _flatten(doc: Dict[str, Any], prefix: str = ""):
    for key, value in doc.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
