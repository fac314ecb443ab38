"""What one emulated cluster is, and where it is kept: the names of its bridge,
machines and namespaces, their addresses and files (Cluster), and its state directory
/run/commbench/clusters/NAME, whose state.json is written before anything is made so
that `down` finds the remains of a crashed `up`.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from commbench import units
from commbench.cluster import shaping
from commbench.errors import UsageError

# Where a process on a machine finds what results record of the emulated network.
EMULATED_NETWORK = "COMMBENCH_EMULATED_NETWORK"
STATE_ROOT = Path(os.environ.get("COMMBENCH_CLUSTER_STATE", "/run/commbench/clusters"))
HOST_OCTET = 254


@dataclass(frozen=True)
class Cluster:
    name: str
    machines: int
    slots: int
    link: str  # tc rate, e.g. "1gbit"
    subnet: str  # e.g. "10.213.7.0/24"
    # machines whose NIC has a rate of its own ("m3" -> "100mbit"): uneven links
    link_of: Dict[str, str] = field(default_factory=dict)

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

    def enter(self, i: int) -> List[str]:
        """What a command line is prefixed with to run on machine i: in its namespaces
        (its network, its hostname, its /etc/hosts). Neither tool forks: the process
        started is the command itself, to be watched and signalled as one."""
        return ["nsenter", f"--uts={self.uts(i)}", "--", "ip", "netns", "exec", self.netns(i)]

    def machine_environment(self) -> Dict[str, str]:
        """What a process on a machine is told beside the caller's environment: what
        results record as the emulated network (and how ranks know they share the
        host's cores with every other machine), and the machine's NIC for gloo."""
        return {"GLOO_SOCKET_IFNAME": self.nic, EMULATED_NETWORK: json.dumps(
            dict(self.describe(), host=socket.gethostname()))}

    def link_at(self, i: int) -> str:
        """Machine i's NIC rate: its own where --link-of gave it one, else the cluster's."""
        return self.link_of.get(f"m{i}", self.link)

    def describe(self) -> Dict[str, object]:
        """What results record as the emulated network: the cluster's rate, the machines
        whose rate differs (`link_of`, by machine index) and every machine's own rate
        (`links`, by hostname)."""
        return {"cluster": self.name, "machines": self.machines, "slots": self.slots,
                "link": self.link, "link_bits_per_second": self.link_bits, "nic": self.nic,
                "burst_bytes": shaping.burst_bytes(self.link_bits),
                "link_of": dict(sorted(self.link_of.items(), key=lambda kv: int(kv[0][1:]))),
                "links": {self.machine(i): self.link_at(i) for i in range(self.machines)},
                "refill_seconds": max(shaping.burst_bytes(bits) * 8 / bits for bits in
                                      (units.rate_bits(self.link_at(i))
                                       for i in range(self.machines))),
                "latency": "none added (host's own; netem is not used)"}


def as_on_a_machine() -> Dict[str, str]:
    """What a check made on the host (a sweep's, `commbench torchft`'s) is told to judge a
    job as its ranks on a cluster's machines will: that they run on one, with a NIC."""
    return {EMULATED_NETWORK: json.dumps({"nic": "the cluster's"})}


MACHINE_RATE = re.compile(r"m(\d+)=(.+)$")


def parse_link_of(texts: Sequence[str], machines: int) -> Dict[str, str]:
    """--link-of MACHINE=RATE[,MACHINE=RATE...] (repeatable) as {"m3": tc rate}; a
    malformed pair, a machine the cluster does not have, or one named twice is a
    UsageError."""
    found: Dict[str, str] = {}
    for text in texts:
        for pair in text.split(","):
            matched = MACHINE_RATE.match(pair.strip())
            if not matched:
                raise UsageError(f"argument --link-of: {pair.strip()!r} is not MACHINE=RATE "
                                 "(e.g. m3=100mbit)")
            index, rate = int(matched.group(1)), matched.group(2)
            if index >= machines:
                raise UsageError(f"argument --link-of: m{index} is not a machine of this "
                                 f"cluster (m0 to m{machines - 1})")
            if f"m{index}" in found:
                raise UsageError(f"argument --link-of: m{index} is given twice")
            found[f"m{index}"] = units.tc_rate(rate, "--link-of")
    return found


def load(name: str) -> Optional[Cluster]:
    try:
        return Cluster(**json.loads((STATE_ROOT / name / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def clusters() -> List[Cluster]:
    found = (load(p.parent.name) for p in sorted(STATE_ROOT.glob("*/state.json")))
    return [c for c in found if c is not None]


@contextlib.contextmanager
def registering():
    """Held while a cluster takes its subnet and writes its state: two `up`s at once
    (two sweeps, or test runs side by side) would otherwise both find one /24 free."""
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(STATE_ROOT / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
