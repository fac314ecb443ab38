"""The knobs of generated data (`--data learnable:classes=20,noise=6`,
`--data language:vocab=64,order=1`): NAME=VALUE items, any subset, any order, each
checked, a bad one refused in one line that lists what the kind takes."""

from __future__ import annotations

from typing import Any, Callable, Dict

from commbench.errors import UsageError


def parse(text: str, kinds: Dict[str, Callable[[str], Any]], valid: Callable[[str, Any], bool],
          data: str, form: str) -> Dict[str, Any]:
    """{name: value} of `text`; kinds: each knob's type; valid(name, value): whether the
    value is one it takes; data and form: the kind and its knobs as the error names them."""
    values: Dict[str, Any] = {}
    for item in filter(None, (k.strip() for k in text.split(","))):
        name, _, value = item.partition("=")
        try:
            values[name] = kinds[name](value)
        except (KeyError, ValueError):
            values[name] = None
        if values[name] is None or not valid(name, values[name]):
            raise UsageError(f"argument --data: {data}'s {item!r} is not one of {form}")
    return values
