"""The network a projection runs on, from what the user gave: links stated as flags
(--link, --intra-link) under a transport profile (--transport, --intra-transport,
--flow-cap), or fitted from microbench files and nccl-tests output. Flags win over
fits; a fitted link measured its transport, so a profile applies to stated links only.
Also the lines the table prints about it and what the projection file records."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from commbench import units
from commbench.errors import UsageError
from commbench.simulate import nccl_tests, transports
from commbench.simulate.link_costs import Link, Network

DEFAULT_INTRA = "150GB/s"
DEFAULT_LATENCY = {"inter": "5us", "intra": "1us"}


@dataclass
class Links:
    network: Network
    transports: Dict[str, transports.Transport]  # by class: the profile a stated link uses
    notes: List[str] = field(default_factory=list)

    def algorithms(self) -> Optional[Tuple[str, ...]]:
        """The allreduce algorithms of the profile between machines, if it names them."""
        return self.transports["inter"].algorithms

    def record(self) -> dict:
        return {kind: transports.record(profile) for kind, profile in self.transports.items()}


def network_from(args, fitted: Dict[Tuple[str, str], Link]) -> Links:
    """fitted: links by (class, op) from microbench files; --nccl-tests files are read
    here and win over them for the classes and ops they measured."""
    profiles = {"inter": transports.get(args.transport, "inter", "--transport"),
                "intra": transports.get(args.intra_transport, "intra", "--intra-transport")}
    flow_cap = units.rate_bits(args.flow_cap, "--flow-cap") / 8 if args.flow_cap else 0.0
    notes: List[str] = []
    if args.nccl_tests:
        paths = [p.strip() for p in args.nccl_tests.split(",") if p.strip()]
        if not paths:
            raise UsageError("argument --nccl-tests: give one or more files, comma-separated")
        # the intra latency the projection will use, so that the fit takes off the same
        intra_alpha = _latency(args, "intra", profiles)
        if intra_alpha is None:
            intra_alpha = profiles["intra"].alpha or 0.0
        from_files, notes = nccl_tests.links(paths, intra_alpha)
        fitted = {**fitted, **from_files}

    def stated(kind: str) -> Optional[Link]:
        rate = args.link if kind == "inter" else args.intra_link
        if rate is None:
            return None
        flag = "--link" if kind == "inter" else "--intra-link"
        return profiles[kind].link(units.rate_bits(rate, flag) / 8,
                                   _latency(args, kind, profiles), flow_cap, rate)

    def pick(kind: str, op: str) -> Optional[Link]:
        other = "neighbor_allreduce" if op == "allreduce" else "allreduce"
        return fitted.get((kind, op)) or fitted.get((kind, other))

    inter, intra = stated("inter"), stated("intra")
    network = Network(intra or pick("intra", "allreduce"), inter or pick("inter", "allreduce"),
                      intra or pick("intra", "neighbor_allreduce"),
                      inter or pick("inter", "neighbor_allreduce"))
    if network.inter is None:
        raise UsageError("no network between machines: pass --link RATE (e.g. 25gbit), "
                         "microbench files measured across machines or --nccl-tests output")
    if network.intra is None:  # rarely the bottleneck: a stated default, said so
        default = profiles["intra"].link(
            units.rate_bits(DEFAULT_INTRA) / 8, _latency(args, "intra", profiles), 0.0,
            DEFAULT_INTRA)
        default = replace(default, source=f"assumed {DEFAULT_INTRA}, NVLink class"
                          + ("" if profiles["intra"].name == transports.LINE_RATE
                             else f" at {profiles['intra'].name}'s "
                                  f"{100 * profiles['intra'].efficiency:.0f}%")
                          + ": pass --intra-link")
        network = replace(network, intra=default, exchange_intra=default)
    from_files = {"inter": inter is None, "intra": intra is None and (
        pick("intra", "allreduce") or pick("intra", "neighbor_allreduce")) is not None}
    for kind in ("inter", "intra"):
        if from_files[kind] and profiles[kind].name != transports.LINE_RATE:
            notes.append(f"transport {profiles[kind].name} not applied {_where(kind)}: its "
                         f"link was fitted from files, which measured their transport.")
    if flow_cap and (inter is None or profiles["inter"].streams is None):
        notes.append(f"--flow-cap not applied: {profiles['inter'].name} is not capped per "
                     f"flow" if inter is not None else "--flow-cap not applied: the link "
                     "between machines was fitted, not stated.")
    return Links(network, profiles, notes)


def _latency(args, kind: str, profiles) -> Optional[float]:
    """A stated latency, else the profile's (None: use it), else the default."""
    text = args.latency if kind == "inter" else args.intra_latency
    flag = "--latency" if kind == "inter" else "--intra-latency"
    if text is not None:
        return units.seconds(text, flag)
    if profiles[kind].alpha is not None:
        return None
    return units.seconds(DEFAULT_LATENCY[kind], flag)


def _where(kind: str) -> str:
    return "between machines" if kind == "inter" else "inside machines"


def describe(links: Links) -> List[str]:
    """The table's lines on transports: the profile of each class a stated link uses."""
    inter, intra = links.transports["inter"], links.transports["intra"]
    line = f"transport between machines: {transports.describe(inter)}"
    if intra.name != transports.LINE_RATE:
        line += f"; inside machines: {transports.describe(intra)}"
    return [line + "."] + links.notes
