"""The network of a projection: for each link class (inside a machine, between
machines) a latency α, seconds per message, and β, seconds per byte, so that a message
of S bytes costs α + β·S; which class a microbench file's ranks measured. Stated as
flags or fitted from microbench files by commbench.simulate.calibrate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class Link:
    """One link class. beta_ci: half-width of β's 95% interval (0 when stated)."""

    alpha: float
    beta: float
    beta_ci: float = 0.0
    source: str = "stated"

    def seconds(self, nbytes: float, messages: float = 1.0) -> float:
        return messages * self.alpha + nbytes * self.beta

    def bound(self, side: int) -> "Link":
        """The link at the fast (side -1) or slow (+1) end of β's interval."""
        return replace(self, beta=max(self.beta + side * self.beta_ci, self.beta * 0.01))

    def describe(self) -> str:
        rate = "unbounded" if not self.beta else f"{1 / self.beta / 1e9:.3g} GB/s" \
            if self.beta < 8e-12 else f"{8 / self.beta / 1e9:.3g} Gbit/s"
        spread = f" ±{100 * self.beta_ci / self.beta:.0f}%" if self.beta_ci and self.beta else ""
        return f"{rate}{spread}, latency {self.alpha * 1e6:.3g} us ({self.source})"


@dataclass(frozen=True)
class Network:
    """Links for allreduce traffic and, when fitted apart, for neighbor exchanges: a
    transport can drive one pattern closer to the link's rate than the other."""

    intra: Link  # between ranks on one machine
    inter: Link  # a machine's NIC
    exchange_intra: Optional[Link] = None
    exchange_inter: Optional[Link] = None

    def bound(self, side: int) -> "Network":
        return Network(*(link and link.bound(side) for link in
                         (self.intra, self.inter, self.exchange_intra, self.exchange_inter)))

    def for_exchange(self) -> "Network":
        return Network(self.exchange_intra or self.intra, self.exchange_inter or self.inter)


def link_class(doc: dict) -> str:
    """'inter' for a microbench file whose ranks ran on several machines, else 'intra'."""
    hosts = (doc.get("environment") or {}).get("hostnames") or []
    return "inter" if len(set(hosts)) > 1 else "intra"
