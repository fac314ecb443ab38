"""A machine's link as its network interface counts it: the bytes that left the
machine during a call (every rank on it together, headers included, as the link's
rate limit counts them), read from the kernel's counters of the emulated machine's
interface. Only on an emulated cluster, whose configured rate the result records,
so that each contender's figure can be set against that rate: each machine's against
its own where the links are uneven (a fast machine held back by a slow peer's link
shows below its rate: the slow link at work).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from commbench import units

# A contender below this fraction of the configured rate is flagged in tables; one
# above ABOVE_RATE moved faster than the rate allows over a call: a call short enough to
# fit in the rate limiter's burst, not a figure of the link.
SLOW_FRACTION = 0.8
ABOVE_RATE = 1.05


class NicCounter:
    """Bytes sent so far by this machine's interface `nic` (its own sysfs: a process
    in a network namespace sees that namespace's interfaces)."""

    def __init__(self, nic: str):
        self.path = Path("/sys/class/net") / nic / "statistics" / "tx_bytes"

    def read(self) -> int:
        return int(self.path.read_text())


def counter(network: Optional[Dict[str, Any]], local_rank: Optional[int]) -> Optional[NicCounter]:
    """The counter this rank reads: the first rank of each machine of an emulated
    cluster reads its interface; others, and real machines, none."""
    if not network or not network.get("nic") or local_rank not in (0, None):
        return None
    found = NicCounter(network["nic"])
    try:
        found.read()
    except (OSError, ValueError):
        return None
    return found


def refill_seconds(network: Optional[Dict[str, Any]]) -> float:
    """The pause before each call on an emulated link, so that every call starts with
    the rate limiter's bucket full: without it a call that follows a fast one finds the
    bucket drained by it and pays the rate where the next one fits in the burst, and
    small messages compare the order of the contenders, not the contenders. On uneven
    links, the slowest bucket's. 0 elsewhere."""
    if not network:
        return 0.0
    if network.get("refill_seconds"):
        return float(network["refill_seconds"])
    rate, burst = (network.get(key) for key in ("link_bits_per_second", "burst_bytes"))
    return burst * 8 / rate if rate and burst else 0.0


def own_rate(network: Optional[Dict[str, Any]], machine: Optional[str] = None
             ) -> Optional[float]:
    """This machine's link rate, bits/s: its own where the cluster's links are uneven,
    else the cluster's; None off an emulated cluster. machine: its hostname (default:
    this process's, which inside an emulated machine is the machine's)."""
    if not network:
        return None
    links, host = network.get("links"), machine or socket.gethostname()
    if isinstance(links, dict) and host in links:
        return units.rate_bits(links[host])
    return network.get("link_bits_per_second")


def fraction_of_rate(machines: Sequence[Tuple[float, Optional[float]]]) -> Optional[float]:
    """The machines' bytes out per second, each as a fraction of its own link's rate,
    averaged: (nic_bw bytes/s, rate bits/s) per machine."""
    known = [bw * 8 / rate for bw, rate in machines if rate]
    return sum(known) / len(known) if known else None


def flag(fraction: Optional[float]) -> str:
    if fraction is None:
        return "-"
    note = " (slow)" if fraction < SLOW_FRACTION else " (burst)" if fraction > ABOVE_RATE else ""
    return f"{fraction:.2f}{note}"
