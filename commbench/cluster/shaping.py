"""The capped links of an emulated cluster: the tc token bucket (tbf) that holds each
end of a machine's link to its rate, a NIC's rate in each direction, with no latency
added (the kernel's netem is not used).
"""

from __future__ import annotations

from typing import List

from commbench import units

# tbf: the bucket holds at least one full-size burst of a fast NIC and the queue stays
# shallow, so MPI's and gloo's bursts are paced at the rate rather than dropped late.
BURST_SECONDS, MIN_BURST_BYTES, QUEUE_LATENCY = 0.002, 64 * 1024, "5ms"


def burst_bytes(rate_bits: float) -> int:
    return max(MIN_BURST_BYTES, int(rate_bits / 8 * BURST_SECONDS))


def tbf(link: str) -> List[str]:
    burst = burst_bytes(units.rate_bits(link, "--link"))
    return ["rate", link, "burst", str(burst), "latency", QUEUE_LATENCY]
