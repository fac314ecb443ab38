"""The network of a projection: for each link class (inside a machine, between
machines) a latency α, seconds per message, and β, seconds per byte, so that a message
of S bytes costs α + β·S. Stated as flags (`--link 25gbit`), or fitted from `commbench
microbench` files by least squares over their size sweeps.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

import numpy as np

from commbench.errors import UsageError

# tc's spellings (what `commbench cluster --link` takes) and bytes per second.
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit|B/s|KB/s|MB/s|GB/s|TB/s)$")
_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_BYTES = {"B/s": 1, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12}
_LATENCY = re.compile(r"(\d+(?:\.\d+)?)\s*(s|ms|us|ns)$")
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def bytes_per_second(text: str, flag: str) -> float:
    """'25gbit' (bits, tc's spelling) or '150GB/s' (bytes) in bytes per second."""
    found = _RATE.fullmatch(text.strip())
    if not found or float(found.group(1)) <= 0:
        raise UsageError(f"argument {flag}: {text!r} is not a rate; write e.g. 25gbit, "
                         f"400mbit or 150GB/s")
    value, unit = float(found.group(1)), found.group(2)
    return value * _BITS[unit] / 8 if unit in _BITS else value * _BYTES[unit]


def seconds(text: str, flag: str) -> float:
    """'5us', '1.5ms', '0' in seconds."""
    if text.strip() == "0":
        return 0.0
    found = _LATENCY.fullmatch(text.strip())
    if not found:
        raise UsageError(f"argument {flag}: {text!r} is not a latency; write e.g. 5us or 1ms")
    return float(found.group(1)) * _SECONDS[found.group(2)]


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


DEFAULT_INTRA = "150GB/s"


def fit(points: List[tuple], source: str) -> Link:
    """α, β of time = messages·α + bytes·β by least squares over (messages, bytes,
    seconds) points; α is held at 0 when the free fit makes it negative."""
    x = np.array([[m, b] for m, b, _ in points], dtype=float)
    y = np.array([s for _, _, s in points], dtype=float)
    if len(points) < 3 or len(set(x[:, 1])) < 2:
        raise UsageError(f"cannot fit a link from {source}: it needs at least 3 sizes")
    (alpha, beta), *_ = np.linalg.lstsq(x, y, rcond=None)
    if alpha < 0:
        alpha, x = 0.0, x[:, 1:]
        beta = float(np.linalg.lstsq(x, y, rcond=None)[0][0])
    if beta <= 0:
        raise UsageError(f"cannot fit a link from {source}: time does not grow with size")
    predicted = x @ (np.array([alpha, beta]) if x.shape[1] == 2 else np.array([beta]))
    dof = max(len(y) - x.shape[1], 1)
    sigma2 = float(((y - predicted) ** 2).sum()) / dof
    covariance = sigma2 * np.linalg.pinv(x.T @ x)
    beta_se = math.sqrt(max(covariance[-1, -1], 0.0))
    return Link(float(alpha), float(beta), 1.96 * beta_se, source)


def link_class(doc: dict) -> str:
    """'inter' for a microbench file whose ranks ran on several machines, else 'intra'."""
    hosts = (doc.get("environment") or {}).get("hostnames") or []
    return "inter" if len(set(hosts)) > 1 else "intra"


def fit_microbench(docs: List[dict], names: List[str]) -> Dict[Tuple[str, str], Link]:
    """Links fitted from microbench result documents, by (class, op): intra from
    single-machine files, inter from multi-machine ones (their intra part taken from
    the intra fit when there is one); allreduce and neighbor_allreduce rows apart.
    Each commbench row's time is modelled by commbench.simulate.costs."""
    from commbench.simulate import costs

    found: Dict[Tuple[str, str], List[tuple]] = {}
    sources: Dict[Tuple[str, str], List[str]] = {}
    for doc, name in zip(docs, names):
        kind = link_class(doc)
        for row in doc["rows"]:
            if row.get("commbench") and row["op"] in costs.FITTED_OPS:
                found.setdefault((kind, row["op"]), []).append((doc, row))
                sources.setdefault((kind, row["op"]), [])
                if name not in sources[(kind, row["op"])]:
                    sources[(kind, row["op"])].append(name)
    links: Dict[Tuple[str, str], Link] = {}
    for key in sorted(found, key=lambda k: k[0] == "inter"):  # intra first
        kind, op = key
        points = [costs.fit_point(doc, row, kind, links.get(("intra", op)))
                  for doc, row in found[key]]
        links[key] = fit([p for p in points if p is not None],
                         f"{op} in microbench {', '.join(sources[key])}")
    return links


def network_from(args, fitted: Dict[Tuple[str, str], Link]) -> Network:
    """Flags win over fits; a class neither stated nor fitted is an error. A class
    fitted for one op only serves both."""
    def stated(rate: Optional[str], latency: str, flag: str, lat_flag: str) -> Optional[Link]:
        if rate is None:
            return None
        return Link(seconds(latency, lat_flag), 1.0 / bytes_per_second(rate, flag))

    def pick(kind: str, op: str) -> Optional[Link]:
        other = "neighbor_allreduce" if op == "allreduce" else "allreduce"
        return fitted.get((kind, op)) or fitted.get((kind, other))

    inter = stated(args.link, args.latency, "--link", "--latency")
    intra = stated(args.intra_link, args.intra_latency, "--intra-link", "--intra-latency")
    network = Network(intra or pick("intra", "allreduce"), inter or pick("inter", "allreduce"),
                      intra or pick("intra", "neighbor_allreduce"),
                      inter or pick("inter", "neighbor_allreduce"))
    if network.inter is None:
        raise UsageError("no network between machines: pass --link RATE (e.g. 25gbit) or "
                         "microbench files measured across machines")
    if network.intra is None:  # rarely the bottleneck: a stated default, said so
        default = Link(seconds(args.intra_latency, "--intra-latency"),
                       1.0 / bytes_per_second(DEFAULT_INTRA, "--intra-link"),
                       source=f"assumed {DEFAULT_INTRA}, NVLink class: pass --intra-link")
        network = replace(network, intra=default, exchange_intra=default)
    return network
