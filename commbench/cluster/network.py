"""Make and remove an emulated cluster with iproute2 (`ip`, `tc`) and util-linux
(`unshare`).

What one cluster named NAME is, all of it under its own names:
- a bridge NAME-br on the host, holding the cluster's one host address (.254 of its
  subnet), so that launchers typed on the host reach the machines;
- per machine i: a network namespace NAME-mi whose NIC NAME-br (address .i+1; see
  Cluster.nic) is one end of a veth pair, the other end NAME-mi on the bridge; a persistent UTS namespace (hostname
  NAME-mi) bound to a file in the state directory; /etc/netns/NAME-mi/hosts, which
  `ip netns exec` puts in place of /etc/hosts, so machines find each other by name;
- a tbf qdisc on both ends of every link: the machine's NIC rate, each direction;
- the state directory /run/commbench/clusters/NAME: state.json (written before anything
  is made, so `down` finds the remains of a crashed `up`), the `ssh` stand-in in bin/,
  and env.sh.

The machines have no route beyond their subnet, and nothing is routed or NATed: they
talk to each other and to the bridge's address only.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

from commbench.errors import UsageError

STATE_ROOT = Path(os.environ.get("COMMBENCH_CLUSTER_STATE", "/run/commbench/clusters"))
NETNS_ETC = Path("/etc/netns")
SUBNETS = ipaddress.ip_network("10.213.0.0/16")  # one /24 per cluster
HOST_OCTET = 254
NAME = re.compile(r"[a-z][a-z0-9]{0,7}$")  # NAME-m249 fits an interface name (15)
RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
CAP_NET_ADMIN = 12
# tbf: the bucket holds at least one full-size burst of a fast NIC and the queue stays
# shallow, so MPI's and gloo's bursts are paced at the rate rather than dropped late.
BURST_SECONDS, MIN_BURST_BYTES, QUEUE_LATENCY = 0.002, 64 * 1024, "5ms"


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
        return rate_bits(self.link)

    def describe(self) -> Dict[str, object]:
        """What results record as the emulated network."""
        return {"cluster": self.name, "machines": self.machines, "slots": self.slots,
                "link": self.link, "link_bits_per_second": self.link_bits,
                "latency": "none added (host's own; netem is not used)"}


def rate_bits(rate: str) -> float:
    found = RATE.match(rate)
    if not found:
        raise UsageError(f"--link {rate!r}: give a rate as tc spells it, e.g. 200mbit, 1gbit")
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[found.group(2)]
    return float(found.group(1)) * scale


def check_privileges() -> None:
    """Root or CAP_NET_ADMIN, or one clear line."""
    try:
        caps = next(line for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("CapEff:"))
        allowed = bool(int(caps.split()[1], 16) >> CAP_NET_ADMIN & 1)
    except (OSError, StopIteration, ValueError):
        allowed = os.geteuid() == 0
    if not allowed:
        raise UsageError("an emulated cluster needs root (or CAP_NET_ADMIN) to make network "
                         "namespaces and links: run it with sudo")
    for tool in ("ip", "tc", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            raise UsageError(f"`{tool}` not found: install iproute2 and util-linux")


def tool(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ip/tc/unshare; a failure is one line naming the command."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]
        raise UsageError(f"`{' '.join(argv)}` failed: {why}")
    return done


def load(name: str) -> Optional[Cluster]:
    try:
        return Cluster(**json.loads((STATE_ROOT / name / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def clusters() -> List[Cluster]:
    found = (load(p.parent.name) for p in sorted(STATE_ROOT.glob("*/state.json")))
    return [c for c in found if c is not None]


def free_subnet() -> str:
    """A /24 of SUBNETS that no cluster of ours and no route or address of the host uses."""
    used = {ipaddress.ip_network(c.subnet) for c in clusters()}
    routes = tool("ip", "-j", "route", "show", "table", "all").stdout
    for route in json.loads(routes or "[]"):
        dst = route.get("dst", "")
        try:
            used.add(ipaddress.ip_network(dst, strict=False))
        except ValueError:
            continue  # "default", multicast names, IPv6 in other tables
    for subnet in SUBNETS.subnets(new_prefix=24):
        if not any(subnet.overlaps(other) for other in used if other.version == 4
                   and other.prefixlen > 0):
            return str(subnet)
    raise UsageError(f"no free /24 left in {SUBNETS} for another cluster")


def existing_links() -> set:
    return {link["ifname"] for link in json.loads(tool("ip", "-j", "link").stdout or "[]")}


def existing_netns() -> set:
    return {line.split()[0] for line in tool("ip", "netns", "list").stdout.splitlines()
            if line.strip()}


def up(name: str, machines: int, slots: int, link: str) -> Cluster:
    """Make the cluster; on any failure remove what was made and raise."""
    check_privileges()
    if not NAME.match(name):
        raise UsageError(f"cluster name {name!r}: 1-8 lowercase letters and digits, "
                         "starting with a letter")
    if not 1 <= machines <= 200 or slots < 1:
        raise UsageError("--machines must be 1..200 and --slots at least 1")
    rate_bits(link)
    if load(name) is not None:
        raise UsageError(f"cluster {name} is already up (commbench cluster down --name {name})")
    cluster = Cluster(name, machines, slots, link, free_subnet())
    ours = {cluster.bridge} | {cluster.netns(i) for i in range(machines)}
    taken = ours & (existing_links() | existing_netns())
    if taken:
        raise UsageError(f"{', '.join(sorted(taken))} already exist and are not a commbench "
                         f"cluster's: choose another --name")
    cluster.directory.mkdir(parents=True, exist_ok=True)
    write_atomically(cluster.directory / "state.json", json.dumps(asdict(cluster), indent=1))
    try:
        _make(cluster)
    except BaseException:
        down(name)
        raise
    return cluster


def _make(c: Cluster) -> None:
    prefix = ipaddress.ip_network(c.subnet).prefixlen
    tool("ip", "link", "add", c.bridge, "type", "bridge")
    tool("ip", "addr", "add", f"{c.host_address}/{prefix}", "dev", c.bridge)
    tool("ip", "link", "set", c.bridge, "up")
    hosts = "127.0.0.1 localhost\n" + "".join(
        f"{c.address(i)} {c.machine(i)}\n" for i in range(c.machines))
    for i in range(c.machines):
        ns, outside, inside = c.netns(i), c.netns(i), f"{c.netns(i)}p"
        tool("ip", "netns", "add", ns)
        tool("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        tool("ip", "link", "set", inside, "netns", ns)
        tool("ip", "-n", ns, "link", "set", inside, "name", c.nic)
        tool("ip", "-n", ns, "addr", "add", f"{c.address(i)}/{prefix}", "dev", c.nic)
        tool("ip", "-n", ns, "link", "set", c.nic, "up")
        tool("ip", "-n", ns, "link", "set", "lo", "up")
        tool("ip", "link", "set", outside, "master", c.bridge)
        tool("ip", "link", "set", outside, "up")
        for where in (["-n", ns, "qdisc", "add", "dev", c.nic],  # the machine's sending
                      ["qdisc", "add", "dev", outside]):  # and receiving
            tool("tc", *where, "root", "tbf", *tbf(c.link))
        c.uts(i).touch()
        tool("unshare", f"--uts={c.uts(i)}", "hostname", c.machine(i))
        (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
        write_atomically(NETNS_ETC / ns / "hosts", hosts)
    _write_launch_files(c)


def tbf(link: str) -> List[str]:
    burst = max(MIN_BURST_BYTES, int(rate_bits(link) / 8 * BURST_SECONDS))
    return ["rate", link, "burst", str(burst), "latency", QUEUE_LATENCY]


def _write_launch_files(c: Cluster) -> None:
    """bin/ssh (every launcher reaches a machine through it) and env.sh to source."""
    c.bin.mkdir(exist_ok=True)
    ssh = c.bin / "ssh"
    write_atomically(ssh, f"#!{sys.executable}\n"
                          "# commbench cluster: ssh stand-in, enters the machine's namespaces\n"
                          "from commbench.cluster.ssh import main\nmain()\n")
    ssh.chmod(0o755)
    write_atomically(c.directory / "env.sh", f"export PATH={c.bin}:$PATH\n")


def down(name: str) -> List[str]:
    """Remove everything of cluster `name` that exists, in any state; idempotent."""
    check_privileges()
    cluster = load(name)
    if cluster is None:
        return []
    removed = []
    namespaces = existing_netns()
    for i in range(cluster.machines):
        ns = cluster.netns(i)
        if ns in namespaces:
            _end_processes_in(ns)
            tool("ip", "netns", "delete", ns, check=False)
            removed.append(f"namespace {ns}")
        if (NETNS_ETC / ns).exists():
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        if cluster.uts(i).exists():
            tool("umount", str(cluster.uts(i)), check=False)
    links = existing_links()
    for link in [cluster.netns(i) for i in range(cluster.machines)] + [cluster.bridge]:
        if link in links:  # a veth whose namespace is gone is gone too
            tool("ip", "link", "delete", link, check=False)
            removed.append(f"link {link}")
    shutil.rmtree(cluster.directory, ignore_errors=True)
    return removed


def _end_processes_in(ns: str) -> None:
    """Ranks and daemons left in a machine (a sweep killed with -9) would keep its
    namespace alive: end them, TERM first."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p) for p in tool("ip", "netns", "pids", ns, check=False).stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if not pids:
            return
        time.sleep(1)


def status(cluster: Cluster) -> Dict[str, bool]:
    """Which of the cluster's pieces exist."""
    links, namespaces = existing_links(), existing_netns()
    pieces = {f"bridge {cluster.bridge}": cluster.bridge in links}
    for i in range(cluster.machines):
        pieces[f"machine {cluster.machine(i)} ({cluster.netns(i)}, {cluster.address(i)})"] = \
            cluster.netns(i) in namespaces and cluster.netns(i) in links
    return pieces


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
