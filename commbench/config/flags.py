"""Command-line flags: the value checks every command shares, and flags generated
from dataclass fields, so that a flag, its default, its check and the recorded
value are declared once (in commbench.config.run_config for the run flags, in a plugin's
Options for its own).

A check converts the text of a value or raises ValueError; argparse then reports
"argument --x: must be <what it accepts>, got '<text>'" and exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from typing import Any, Callable, Iterable, List, Optional, Union


# A value that starts with "-" as a number can: -1, -1us, -.5, -inf, -nan. argparse
# takes only -1 and -1.5 for values and any other as a flag with its argument missing
# ("expected one argument"), so that the check that would refuse it never sees it.
NEGATIVE_VALUE = re.compile(r"^-(\.?\d|(inf|infinity|nan)$)", re.IGNORECASE)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block), exit 2, and a value that
    starts with "-" as a number can reaches its flag's check (NEGATIVE_VALUE)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def _parse_optional(self, arg_string):
        if NEGATIVE_VALUE.match(arg_string) and arg_string not in self._option_string_actions:
            return None  # a value, never a flag
        return super()._parse_optional(arg_string)


def accepting(what: str) -> Callable[[Callable[[str], Any]], Callable[[str], Any]]:
    """Turn a converter into an argparse type whose error says what it accepts."""
    def decorate(convert: Callable[[str], Any]) -> Callable[[str], Any]:
        def parse(text: str) -> Any:
            try:
                return convert(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        parse.__name__ = convert.__name__
        parse.accepts = what  # type: ignore[attr-defined]
        return parse
    return decorate


def _at_least(low: int, text: str) -> int:
    value = int(text)
    if value < low:
        raise ValueError
    return value


@accepting("a positive integer")
def positive_int(text: str) -> int:
    return _at_least(1, text)


@accepting("an integer >= 0")
def non_negative_int(text: str) -> int:
    return _at_least(0, text)


@accepting("an integer >= 2")
def int_at_least_2(text: str) -> int:
    return _at_least(2, text)


@accepting("a positive integer H, or two, h1,h2, with h1 < h2")
def periods(text: str) -> Union[int, List[int]]:
    """Every how many steps: H alone, or h1,h2 (inside each machine, over all)."""
    found = [_at_least(1, part) for part in text.split(",")]
    if len(found) == 1:
        return found[0]
    if len(found) != 2 or found[0] >= found[1]:
        raise ValueError
    return found


@accepting("an integer")
def integer(text: str) -> int:
    return int(text)


def _number(text: str, ok: Callable[[float], bool]) -> float:
    value = float(text)
    if not math.isfinite(value) or not ok(value):
        raise ValueError
    return value


@accepting("a positive, finite number")
def positive_float(text: str) -> float:
    return _number(text, lambda v: v > 0)


@accepting("a finite number >= 0")
def non_negative_float(text: str) -> float:
    return _number(text, lambda v: v >= 0)


@accepting("a percentage >= 0")
def percentage(text: str) -> float:
    return _number(text, lambda v: v >= 0)


@accepting("a number between 0 and 1")
def probability(text: str) -> float:
    return _number(text, lambda v: 0 < v < 1)


@accepting("a number greater than 0 and at most 1")
def fraction(text: str) -> float:
    return _number(text, lambda v: 0 < v <= 1)


@accepting("positive integers like 1,2,4")
def positive_ints(text: str) -> List[int]:
    counts = [int(n) for n in text.split(",")]
    if not counts or min(counts) < 1:
        raise ValueError
    return counts


def one_of(choices: Iterable[str]) -> Callable[[str], str]:
    choices = tuple(choices)

    @accepting("one of " + ", ".join(choices))
    def choice(text: str) -> str:
        if text not in choices:
            raise ValueError
        return text
    return choice


def names_from(choices: Iterable[str]) -> Callable[[str], List[str]]:
    """A comma-separated list of names, each one of choices, without repeats."""
    choices = tuple(choices)

    @accepting("a comma-separated list of " + ", ".join(choices))
    def names(text: str) -> List[str]:
        found = [n.strip() for n in text.split(",") if n.strip()]
        if not found or any(n not in choices for n in found):
            raise ValueError
        return list(dict.fromkeys(found))
    return names


def flag(default: Any, help: str, type: Optional[Callable[[str], Any]] = None,
         metavar: Optional[str] = None) -> Any:
    """A dataclass field that is also a flag (`batch_size` -> `--batch-size`); a bool
    field is an on/off switch."""
    return dataclasses.field(default=default,
                             metadata={"help": help, "type": type, "metavar": metavar})


def flag_fields(cls, names: Optional[Iterable[str]] = None) -> List[dataclasses.Field]:
    """The fields of dataclass cls that are flags, all or those named, in order."""
    found = {f.name: f for f in dataclasses.fields(cls) if "help" in f.metadata}
    return list(found.values()) if names is None else [found[n] for n in names]


def option_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_flags(parser, fields: Iterable[dataclasses.Field], dest_prefix: str = "") -> None:
    """One flag per field, on parser (or an argument group of it); each value lands
    in the parsed namespace under dest_prefix + the field's name."""
    for f in fields:
        meta, dest = f.metadata, dest_prefix + f.name
        if f.type in ("bool", bool):
            parser.add_argument(option_name(f.name), action="store_true", dest=dest,
                                help=meta["help"])
            continue
        parser.add_argument(option_name(f.name), type=meta["type"] or str, default=f.default,
                            dest=dest, metavar=meta["metavar"] or f.name.upper(),
                            help=f"{meta['help']} (default: {f.default})")
