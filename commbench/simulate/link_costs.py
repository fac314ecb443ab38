"""What a message costs on the network of a projection: for each link class (inside a
machine, between machines) a latency α, seconds per message, and β, seconds per byte,
so that a message of S bytes costs α + β·S; which class a microbench file's ranks
measured. Stated as flags (through a transport profile, commbench.simulate.transports),
fitted from microbench files by commbench.simulate.calibrate or from nccl-tests output
by commbench.simulate.nccl_tests.

A link fitted from nccl-tests also keeps β as measured at each message size (NCCL's
protocols make mid-size messages slower than α + β·S says), and a stated link may
carry a rate per flow: on networks that cap each TCP flow, a transport reaches the
link's rate only with enough flows at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

import numpy as np

from commbench import units


@dataclass(frozen=True)
class Link:
    """One link class. beta_ci: half-width of β's 95% interval (0 when stated).
    curve: (message bytes, β measured at that size), ascending, from nccl-tests.
    flow_rate: bytes/s one flow of the transport reaches (0: no cap per flow).
    ring_flows: flows a collective keeps open across a machine's NIC at once."""

    alpha: float
    beta: float
    beta_ci: float = 0.0
    source: str = "stated"
    curve: Tuple[Tuple[float, float], ...] = ()
    flow_rate: float = 0.0
    ring_flows: int = 1

    def beta_at(self, size: float, flows: float = 1.0) -> float:
        """Seconds per byte for messages of `size` bytes with `flows` flows at once:
        the measured curve where there is one (interpolated in log size, its end
        values beyond it), never faster than the flows' capped rate."""
        beta = self.beta
        if self.curve and size > 0:
            sizes, betas = zip(*self.curve)
            beta = float(np.interp(np.log(size), np.log(sizes), betas))
        if self.flow_rate:
            beta = max(beta, 1.0 / (max(flows, 1.0) * self.flow_rate))
        return beta

    def seconds(self, nbytes: float, messages: float = 1.0, size: Optional[float] = None,
                flows: float = 1.0) -> float:
        """`messages` messages of `size` bytes each (default: nbytes) moving nbytes."""
        return messages * self.alpha + nbytes * self.beta_at(
            nbytes if size is None else size, flows)

    def bound(self, side: int) -> "Link":
        """The link at the fast (side -1) or slow (+1) end of β's interval (a cap per
        flow is the network's, stated, and stays)."""
        beta = max(self.beta + side * self.beta_ci, self.beta * 0.01)
        scale = beta / self.beta if self.beta else 1.0
        return replace(self, beta=beta, curve=tuple((s, b * scale) for s, b in self.curve))

    def describe(self) -> str:
        spread = f" ±{100 * self.beta_ci / self.beta:.0f}%" if self.beta_ci and self.beta else ""
        flows = f", at most {8 * self.flow_rate / 1e9:.3g} Gbit/s per flow" \
            if self.flow_rate else ""
        # With a measured curve the projection reads each size's own figure, not the fit's
        sizes = (f"; per size as measured, {_rate(self.curve[0][1])} at "
                 f"{units.format_bytes(self.curve[0][0])} to {_rate(self.curve[-1][1])} at "
                 f"{units.format_bytes(self.curve[-1][0])}") if self.curve else ""
        return (f"{_rate(self.beta)}{spread}{sizes}, latency {self.alpha * 1e6:.3g} us{flows} "
                f"({self.source})")


def _rate(beta: float) -> str:
    """A link's rate from its seconds per byte: GB/s when fast, else Gbit/s."""
    if not beta:
        return "unbounded"
    return f"{1 / beta / 1e9:.3g} GB/s" if beta < 8e-12 else f"{8 / beta / 1e9:.3g} Gbit/s"


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
