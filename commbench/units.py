"""Rates, sizes and latencies as users write them on the command line, parsed in one
place so that every command takes the same spellings:

- a link rate in bits per second as tc spells it (`25gbit`, `200mbit`, `1gbit`; any
  case, optionally ending in `/s`: `25Gbit/s`), or in bytes per second (`150GB/s`);
- a message size in bytes, nccl-tests style: `8`, `1K`, `64M`, `1G`, powers of 1024,
  optionally ending in `B` (`256MB`);
- a latency: `5us`, `1.5ms`, `0`.

A bad spelling is a UsageError of one line that names the flag and the accepted forms.
"""

from __future__ import annotations

import re
from typing import Optional

from commbench.errors import UsageError

RATE_FORMS = ("as tc spells it (e.g. 25gbit, 200mbit, or 25Gbit/s) or in bytes per second "
              "(e.g. 150GB/s)")
SIZE_FORMS = "a positive size such as 8, 4K, 64M or 1G"
LATENCY_FORMS = "write e.g. 5us or 1ms"

_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:(?P<bits>[kmgt]?)bit(?:/s)?|(?P<bytes>[kmgt]?)B/s)",
                   re.IGNORECASE)
# tc reads these as they are; any other accepted spelling reaches tc rewritten in them.
_TC_RATE = re.compile(r"\d+(?:\.\d+)?(?:bit|kbit|mbit|gbit|tbit)")
_TC_UNITS = (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0))

_SIZE = re.compile(r"\s*(\d+)\s*([KMGkmg]?)[Bb]?\s*")
_BINARY = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}  # nccl-tests: powers of 1024

_LATENCY = re.compile(r"(\d+(?:\.\d+)?)\s*(s|ms|us|ns)")
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _bad(flag: Optional[str], text: str, what: str) -> UsageError:
    return UsageError(f"{f'argument {flag}: ' if flag else ''}{text!r} is not {what}")


def rate_bits(text: str, flag: Optional[str] = None) -> float:
    """A link rate in bits per second."""
    found = _RATE.fullmatch(text.strip())
    # "25Gb/s" matches the byte form only case-insensitively: bits or bytes, nobody knows.
    if (not found or float(found.group(1)) <= 0
            or found.group("bits") is None and not found.group(0).endswith("B/s")):
        raise _bad(flag, text, f"a rate; give a rate {RATE_FORMS}")
    value = float(found.group(1))
    if found.group("bits") is not None:
        return value * _DECIMAL[found.group("bits").lower()]
    return value * _DECIMAL[found.group("bytes").lower()] * 8


def tc_rate(text: str, flag: Optional[str] = None) -> str:
    """The rate as tc's `rate` takes it: tc's own spelling unchanged, any other
    accepted one rewritten (`25Gbit/s` -> `25gbit`, `150GB/s` -> `1.2tbit`)."""
    bits = rate_bits(text, flag)
    return text if _TC_RATE.fullmatch(text) else format_rate(bits)


def format_rate(bits: float) -> str:
    """bits per second in tc's spelling, in the largest unit it reaches: `200mbit`."""
    unit, scale = next(((u, s) for u, s in _TC_UNITS if bits >= s), _TC_UNITS[-1])
    return f"{bits / scale:.12g}{unit}"


def size_bytes(text: str, flag: Optional[str] = None) -> int:
    """A positive message size in bytes."""
    found = _SIZE.fullmatch(text)
    if not found or int(found.group(1)) == 0:
        raise _bad(flag, text, SIZE_FORMS)
    return int(found.group(1)) * _BINARY[found.group(2).upper()]


def format_bytes(nbytes: float) -> str:
    """A size in the spelling size_bytes reads, in the largest binary unit it reaches:
    `64M`, `1.5K`, `8`; from 1000 of a unit up to the next, whole numbers (`1020M`)."""
    unit, scale = next(((u, s) for u, s in sorted(_BINARY.items(), key=lambda item: -item[1])
                        if nbytes >= s), ("", 1))
    value = nbytes / scale
    figures = f"{value:.3g}"  # exponent form from 1000 up: whole numbers there
    return (figures if "e" not in figures else f"{value:.0f}") + unit


def seconds(text: str, flag: Optional[str] = None) -> float:
    """A latency in seconds."""
    if text.strip() == "0":
        return 0.0
    found = _LATENCY.fullmatch(text.strip())
    if not found:
        raise _bad(flag, text, f"a latency; {LATENCY_FORMS}")
    return float(found.group(1)) * _SECONDS[found.group(2)]
