"""Checking a result document before a reader computes with it: each reader declares
the fields it uses once (where, of what type, in which range, whether they must be
finite), and a file with one bad field is skipped with one line that names the field
as a dotted path (`summary.workers`), never a division by zero or a NaN in a table.

A value that a diverged run legitimately records as NaN or infinity (a loss, a
consensus distance) is declared `finite=False`: it passes and is shown as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

from commbench.result.store import encode_non_finite

# What reading a document that passed its checks may still raise on a stranger: caught
# per file, so that one file never stops the others.
READ_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, ArithmeticError)

KINDS = {  # a field's kind: the Python types that are it, and its name in a message
    "number": ((int, float), "a number"),
    "whole": ((int,), "a whole number"),
    "text": ((str,), "text"),
    "bool": ((bool,), "true or false"),
    "section": ((dict,), "a section ({...})"),
    "list": ((list,), "a list"),
    # what a run says of its load: a section naming the crowded machine, or (older
    # files) true or false
    "load": ((bool, dict), "true, false or a section ({...})"),
}
EACH = "*"  # in a path: every item of a list, every value of a section
MAYBE = {"optional": True, "nullable": True}  # a field that may be absent or null
# The shortest time a result can hold: a second count below it (1e-320, say) is a
# broken clock, and a rate of it overflows to infinity.
SECONDS_FLOOR = 1e-9
_MISSING = object()


@dataclass(frozen=True)
class Field:
    """One field a reader uses. path: dotted, EACH for every item; low/high: the range
    (low excluded where above); optional: may be absent; nullable: may be null."""

    path: str
    kind: str
    low: Optional[float] = None
    high: Optional[float] = None
    above: bool = False
    optional: bool = False
    nullable: bool = False
    finite: bool = True


def number(path: str, low: Optional[float] = None, high: Optional[float] = None,
           **options: Any) -> Field:
    return Field(path, "number", low, high, **options)


def whole(path: str, low: Optional[float] = None, high: Optional[float] = None,
          **options: Any) -> Field:
    return Field(path, "whole", low, high, **options)


def text(path: str, **options: Any) -> Field:
    return Field(path, "text", **options)


def flag(path: str, **options: Any) -> Field:
    return Field(path, "bool", **options)


def load(path: str, **options: Any) -> Field:
    return Field(path, "load", **options)


def section(path: str, **options: Any) -> Field:
    return Field(path, "section", **options)


def items(path: str, **options: Any) -> Field:
    return Field(path, "list", **options)


class Invalid(ValueError):
    """A field a reader needs is missing, of the wrong type or out of range."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field} {problem}")


def check(doc: Any, fields: Sequence[Field]) -> None:
    """Raise Invalid for the first field of doc that is not as declared. A field
    inside a section or list that is absent or null is not looked at: whether that
    may be is its parent's declaration (fields are checked in the order given)."""
    for field in fields:
        for name, value in _values(doc, field.path.split("."), ""):
            _check_value(field, name, value)


def usable(found: Iterable[Any], kind: str, fields: Sequence[Field],
           read: Callable[[Any], Any] = lambda result: result) -> Tuple[List[Any], List[str]]:
    """What `read` makes of each result of found (commbench.result.store.Result) whose
    document passes fields, and one line per result that does not or that `read`
    cannot use (it raises Invalid, naming the field, for what fields cannot say)."""
    kept, notes = [], []
    for result in found:
        try:
            check(result.doc, fields)
            kept.append(read(result))
        except READ_ERRORS as e:
            notes.append(skipped(result.path, kind, e))
    return kept, notes


def skipped(path: Path, kind: str, error: Exception) -> str:
    """The one warning line for a file of `kind` that a reader cannot use."""
    why = str(error) if isinstance(error, Invalid) else f"{type(error).__name__}: {error}"
    return f"skipping {path}: incomplete or malformed {kind} result: {why}"


def shown(value: Any) -> str:
    """A value as a message quotes it: non-finite numbers as result files write them."""
    if isinstance(value, float) and not math.isfinite(value):
        return encode_non_finite(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    found = repr(value) if isinstance(value, str) else str(value)
    return found if len(found) <= 40 else found[:37] + "..."


def _values(node: Any, parts: Sequence[str], prefix: str) -> Iterator[Tuple[str, Any]]:
    """(dotted name, value or _MISSING) of every place the path names in node."""
    head, rest = parts[0], parts[1:]
    if head == EACH:
        if isinstance(node, list):
            children: Iterable[Tuple[str, Any]] = ((f"{prefix}[{i}]", v)
                                                   for i, v in enumerate(node))
        elif isinstance(node, dict):
            children = ((f"{prefix}.{k}", v) for k, v in node.items())
        else:
            raise Invalid(prefix, f"is {shown(node)}, not a list or a section")
    else:
        if not isinstance(node, dict):
            raise Invalid(prefix, f"is {shown(node)}, not a section")
        name = f"{prefix}.{head}" if prefix else head
        children = [(name, node.get(head, _MISSING))]
    for name, value in children:
        if not rest:
            yield name, value
        elif value is not _MISSING and value is not None:
            yield from _values(value, rest, name)


def _check_value(field: Field, name: str, value: Any) -> None:
    if value is _MISSING:
        if not field.optional:
            raise Invalid(name, "is missing")
        return
    if value is None:
        if not field.nullable:
            raise Invalid(name, "is null")
        return
    types, called = KINDS[field.kind]
    if not isinstance(value, types) or \
            (isinstance(value, bool) and field.kind not in ("bool", "load")):
        raise Invalid(name, f"is {shown(value)}, not {called}")
    if field.kind not in ("number", "whole"):
        return
    if isinstance(value, float) and not math.isfinite(value):
        if field.finite:
            raise Invalid(name, f"is {shown(value)}, not a finite number")
        return
    if field.low is not None and (value <= field.low if field.above else value < field.low):
        raise Invalid(name, f"is {shown(value)}, not {'>' if field.above else '>='} "
                            f"{field.low:g}")
    if field.high is not None and value > field.high:
        raise Invalid(name, f"is {shown(value)}, not <= {field.high:g}")
