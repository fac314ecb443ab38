"""What one emulated cluster is, and where it is kept: the names of its bridge,
machines and namespaces, their addresses and files (Cluster), and its state directory
/run/commbench/clusters/NAME, whose state.json is written before anything is made so
that `down` finds the remains of a crashed `up`.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from commbench import units
from commbench.cluster import shaping

STATE_ROOT = Path(os.environ.get("COMMBENCH_CLUSTER_STATE", "/run/commbench/clusters"))
HOST_OCTET = 254


@dataclass(frozen=True)
class Cluster:
    name: str
    machines: int
    slots: int
    link: str  # tc rate, e.g. "1gbit"
    subnet: str  # e.g. "10.213.7.0/24"

    @property
    def directory(self) -> Path:
        return STATE_ROOT / self.name

    @property
    def bridge(self) -> str:
        return f"{self.name}-br"

    @property
    def nic(self) -> str:
        """Each machine's network interface. Named as the host's end of the network (the
        bridge), as on a real cluster where every machine, the launching one too, has
        the same NIC name: launchers that find the common interface of the machines
        then find the host's address on it (horovodrun's gloo rendezvous does)."""
        return self.bridge

    def machine(self, i: int) -> str:
        """Hostname of machine i: the cluster's name in it, so that two clusters'
        machines never share a name (launchers cache what they learn of a host by
        name: horovodrun its interfaces)."""
        return f"{self.name}-m{i}"

    def netns(self, i: int) -> str:
        return f"{self.name}-m{i}"

    def address(self, i: int) -> str:
        return str(ipaddress.ip_network(self.subnet)[i + 1])

    @property
    def host_address(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[HOST_OCTET])

    def uts(self, i: int) -> Path:
        return self.directory / f"m{i}.uts"

    @property
    def bin(self) -> Path:
        return self.directory / "bin"

    @property
    def hosts(self) -> str:
        """The `-H` of a job on every slot of every machine."""
        return ",".join(f"{self.machine(i)}:{self.slots}" for i in range(self.machines))

    @property
    def link_bits(self) -> float:
        return units.rate_bits(self.link, "--link")

    def describe(self) -> Dict[str, object]:
        """What results record as the emulated network."""
        return {"cluster": self.name, "machines": self.machines, "slots": self.slots,
                "link": self.link, "link_bits_per_second": self.link_bits, "nic": self.nic,
                "burst_bytes": shaping.burst_bytes(self.link_bits),
                "latency": "none added (host's own; netem is not used)"}


def load(name: str) -> Optional[Cluster]:
    try:
        return Cluster(**json.loads((STATE_ROOT / name / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def clusters() -> List[Cluster]:
    found = (load(p.parent.name) for p in sorted(STATE_ROOT.glob("*/state.json")))
    return [c for c in found if c is not None]


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
