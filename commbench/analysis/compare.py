"""`commbench compare BASE NEW`: A/B comparison of two sets of results, matched on
configuration (group key without hardware and tag, strategy and topology
settings, workers): the flags, reading the two arms, and the exit status. The
comparison itself, its test and its tables, is commbench.analysis.comparison's.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Optional

from commbench.analysis import accuracy_reading, reader, reading
from commbench.analysis.comparison import Comparison


def add_arguments(parser) -> None:
    parser.add_argument("base", metavar="BASE", help="result file or directory (the A arm)")
    parser.add_argument("new", metavar="NEW", help="result file or directory (the B arm)")
    parser.add_argument("--threshold", type=_percent, default=5.0, metavar="PERCENT",
                        help="smallest |delta| that counts as a change (default: 5)")
    parser.add_argument("--alpha", type=_probability, default=0.05,
                        help="significance level of the test (default: 0.05)")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="exit 1 when a configuration is significantly slower by more "
                        "than the threshold (in img/sec or tokens/sec, or in time to the target)")


def _number(text: str, ok, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not ok(value):  # nan fails every test
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def _percent(text: str) -> float:
    return _number(text, lambda v: v >= 0, "a percentage >= 0")


def _probability(text: str) -> float:
    return _number(text, lambda v: 0 < v < 1, "a number between 0 and 1")


def main(args) -> int:
    return compare(args.base, args.new, args.threshold / 100, args.alpha, args.format,
                   args.fail_on_regression)


def compare(base: str, new: str, threshold: float = 0.05, alpha: float = 0.05,
            fmt: str = "text", fail_on_regression: bool = False,
            out: Optional[IO[str]] = None, err: Optional[IO[str]] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    arms, trained = [], []
    for name, path in (("BASE", base), ("NEW", new)):
        read_in, notes = reader.read([path], {reading.KIND: reading.usable,
                                              accuracy_reading.KIND: accuracy_reading.usable})
        runs, to_target = read_in[reading.KIND], read_in[accuracy_reading.KIND]
        for note in notes:
            print(f"commbench compare: warning: {note}", file=err)
        if not runs and not to_target:
            print(f"commbench compare: error: no usable commbench run results in {name} "
                  f"({path})", file=err)
            return 1
        arms.append(runs)
        trained.append(to_target)
    result = Comparison(arms[0], arms[1], threshold, alpha, *trained)
    out.write(result.json() if fmt == "json" else result.text(base, new, fmt))
    out.flush()
    return 1 if fail_on_regression and result.regressions else 0
