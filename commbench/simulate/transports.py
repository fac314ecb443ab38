"""Transport profiles: what a stated link's line rate becomes under the software that
moves the bytes. A transport (NCCL over sockets or RDMA, gloo over TCP, NCCL over
NVLink) reaches a share of the line rate for large messages, pays a cost per message,
and opens some number of flows per connection; on a network that caps each flow
(clouds do), few flows cannot fill the NIC. Every figure below is a published
microbenchmark (the latencies of nccl-ib and nvlink: NCCL's own tuning constants),
cited in docs/simulate.md ("Transports") with its stack and the figure it comes from;
none is fitted to an end-to-end scaling result.

A profile applies only to a link stated with --link or --intra-link: a link fitted
from microbench or nccl-tests files already measured its transport.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from commbench.errors import UsageError
from commbench.simulate.link_costs import Link


@dataclass(frozen=True)
class Transport:
    """efficiency: large-message bus bandwidth / line rate; span: the lowest and highest
    published efficiency (the projection's band); alpha: seconds per message, None to
    keep the stated latency; streams: flows one connection opens (None: RDMA, no flow
    caps apply); ring_flows: connections a collective keeps across a machine boundary;
    algorithms: the allreduce algorithms the library chooses from."""

    name: str
    classes: Tuple[str, ...]  # "inter": between machines, "intra": inside one
    efficiency: float
    span: Tuple[float, float]
    alpha: Optional[float]
    streams: Optional[int]
    ring_flows: int
    algorithms: Optional[Tuple[str, ...]]
    stack: str
    sources: Tuple[str, ...]

    def link(self, rate_bytes: float, latency: Optional[float], flow_cap: float,
             rate_text: str) -> Link:
        """The link of `rate_bytes` bytes/s line rate under this transport. latency: a
        stated one wins over the profile's; flow_cap: bytes/s per flow, 0 for none."""
        alpha = latency if latency is not None else self.alpha
        low, high = self.span
        beta = 1.0 / (rate_bytes * self.efficiency)
        spread = (1.0 / (rate_bytes * low) - 1.0 / (rate_bytes * high)) / 2
        per_flow = flow_cap * self.streams if flow_cap and self.streams else 0.0
        source = "stated" if self.name == LINE_RATE else \
            f"{rate_text} at {self.name}'s {100 * self.efficiency:.0f}%"
        return Link(alpha if alpha is not None else 0.0, beta, spread, source,
                    flow_rate=per_flow, ring_flows=self.ring_flows)


LINE_RATE = "line-rate"
NCCL_TUNING = "https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc"
# Each figure's source, stack and derivation: docs/simulate.md, "Transports".
PROFILES: Dict[str, Transport] = {t.name: t for t in (
    # No transport losses: the default, so that a stated link means what it meant
    # before transports existed (and the checks of stated-link projections stand).
    Transport(LINE_RATE, ("inter", "intra"), 1.0, (1.0, 1.0), None, None, 1, None,
              "the link's line rate, no transport", ()),
    # RDMA moves bytes without the kernel's TCP stack: no cap per flow applies.
    Transport("nccl-ib", ("inter",), 0.96, (0.96, 0.96), 14e-6, None, 2, ("ring", "tree"),
              "NCCL over InfiniBand/RoCE (GPUDirect RDMA)",
              ("https://github.com/NVIDIA/nccl-tests/issues/119", NCCL_TUNING)),
    # One socket per channel unless NCCL recognises the NIC (NCCL_SOCKET_NTHREADS x
    # NCCL_NSOCKS_PERTHREAD), two channels across a machine boundary.
    Transport("nccl-socket", ("inter",), 0.54, (0.40, 0.70), 42e-6, 1, 2, ("ring", "tree"),
              "NCCL over TCP sockets (NCCL_IB_DISABLE=1 or no RDMA NIC)",
              ("https://github.com/NVIDIA/nccl-tests/issues/83",
               "https://github.com/NVIDIA/nccl/issues/209",
               "https://github.com/NVIDIA/nccl/issues/450",
               "https://github.com/NVIDIA/nccl-tests/issues/82",
               "https://github.com/NVIDIA/nccl/blob/master/src/transport/net_socket.cc")),
    # One TCP pair per peer and a ring only; the low end is gloo's one thread pinned to
    # one core, which the CPU and not the NIC limits.
    Transport("gloo-tcp", ("inter",), 0.57, (0.21, 0.60), 44e-6, 1, 1, ("ring",),
              "gloo over TCP (torch.distributed's gloo backend)",
              ("https://github.com/pytorch/gloo/blob/main/README.md",
               "https://github.com/pytorch/gloo/issues/248")),
    Transport("nvlink", ("intra",), 0.82, (0.82, 0.82), 3.4e-6, None, 1, None,
              "NCCL over NVLink inside a machine",
              ("https://github.com/NVIDIA/nccl-tests/issues/212", NCCL_TUNING)),
)}


def get(name: Optional[str], link_class: str, flag: str) -> Transport:
    """The profile called `name` (None: line rate) for the `link_class` link."""
    profile = PROFILES.get(name or LINE_RATE)
    if profile is None:
        raise UsageError(f"argument {flag}: no transport {name!r}; known: "
                         f"{', '.join(PROFILES)}")
    if link_class not in profile.classes:
        where = "between machines" if link_class == "inter" else "inside a machine"
        raise UsageError(f"argument {flag}: {name} is not a transport {where}; those are: "
                         f"{', '.join(n for n, p in PROFILES.items() if link_class in p.classes)}")
    return profile


def describe(profile: Transport) -> str:
    if profile.name == LINE_RATE:
        return f"{LINE_RATE} (the link's full rate; real transports reach less: --transport)"
    low, high = profile.span
    spread = "" if low == high else f", published {100 * low:.0f}-{100 * high:.0f}%"
    latency = f", {profile.alpha * 1e6:g} us per message" if profile.alpha is not None else ""
    return (f"{profile.name}: {profile.stack}, {100 * profile.efficiency:.0f}% of the "
            f"line rate{spread}{latency}")


def record(profile: Transport) -> dict:
    """What a projection file keeps of a profile."""
    return {"name": profile.name, "efficiency": profile.efficiency, "span": list(profile.span),
            "alpha": profile.alpha, "streams": profile.streams,
            "ring_flows": profile.ring_flows, "stack": profile.stack,
            "sources": list(profile.sources)}
