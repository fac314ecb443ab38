"""Make and remove an emulated cluster with iproute2 (`ip`, `tc`) and util-linux
(`unshare`), and tell which of its pieces exist.

What one cluster named NAME is made of, all of it under its own names:
- a bridge NAME-br on the host, holding the cluster's one host address (.254 of its
  subnet), so that launchers typed on the host reach the machines;
- per machine i: a network namespace NAME-mi whose NIC NAME-br (address .i+1; see
  Cluster.nic) is one end of a veth pair, the other end NAME-mi on the bridge; a
  persistent UTS namespace (hostname NAME-mi) bound to a file in the state directory;
  /etc/netns/NAME-mi/hosts, which `ip netns exec` puts in place of /etc/hosts, so
  machines find each other by name;
- a tbf qdisc on both ends of every link (commbench.cluster.shaping), at the cluster's
  rate or, for machines given one of their own (--link-of), at that: uneven links;
- the state directory (commbench.cluster.state) with the `ssh` stand-in in bin/ and
  env.sh.

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
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set

from commbench import units
from commbench.cluster.host import check_privileges, existing_links, existing_netns, tool
from commbench.cluster.shaping import tbf
from commbench.cluster.state import (Cluster, clusters, load, parse_link_of, registering,
                                     write_atomically)
from commbench.errors import UsageError

NETNS_ETC = Path("/etc/netns")
SUBNETS = ipaddress.ip_network("10.213.0.0/16")  # one /24 per cluster
NAME = re.compile(r"[a-z][a-z0-9]{0,7}$")  # NAME-m249 fits an interface name (15)
# How long a launch waits for a machine cut off by --fail to come back, and how often it
# looks: a cut without +REJOIN comes back once the cut rank has ended (at the latest
# after its --timeout, 300 s by default).
MACHINES_PATIENCE = 600.0
POLL_SECONDS = 0.5


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


def up(name: str, machines: int, slots: int, link: str,
       link_of: Sequence[str] = ()) -> Cluster:
    """Make the cluster, every machine's NIC at `link` but those `link_of` gives a rate of
    their own (--link-of's MACHINE=RATE texts); on any failure remove what was made and
    raise."""
    check_privileges()
    if not NAME.match(name):
        raise UsageError(f"cluster name {name!r}: 1-8 lowercase letters and digits, "
                         "starting with a letter")
    if not 1 <= machines <= 200 or slots < 1:
        raise UsageError("--machines must be 1..200 and --slots at least 1")
    link = units.tc_rate(link, "--link")
    own_rates = parse_link_of(link_of, machines)
    with registering():
        if load(name) is not None:
            raise UsageError(f"cluster {name} is already up (commbench cluster down --name "
                             f"{name})")
        cluster = Cluster(name, machines, slots, link, free_subnet(), own_rates)
        ours = {cluster.bridge} | {cluster.netns(i) for i in range(machines)}
        taken = ours & (existing_links() | existing_netns())
        if taken:
            raise UsageError(f"{', '.join(sorted(taken))} already exist and are not a "
                             f"commbench cluster's: choose another --name")
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
            tool("tc", *where, "root", "tbf", *tbf(c.link_at(i)))
        c.uts(i).touch()
        tool("unshare", f"--uts={c.uts(i)}", "hostname", c.machine(i))
        (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
        write_atomically(NETNS_ETC / ns / "hosts", hosts)
    _write_launch_files(c)


def _write_launch_files(c: Cluster) -> None:
    """bin/ssh (every launcher reaches a machine through it) and env.sh to source."""
    c.bin.mkdir(exist_ok=True)
    ssh = c.bin / "ssh"
    write_atomically(ssh, f"#!{sys.executable}\n"
                          "# commbench cluster: ssh stand-in, enters the machine's namespaces\n"
                          "from commbench.cluster.ssh import main\nmain()\n")
    ssh.chmod(0o755)
    write_atomically(c.directory / "env.sh",
                     "".join(f"export {k}={v}\n" for k, v in launch_environment(c).items()))


def launch_environment(c: Cluster) -> Dict[str, str]:
    """What env.sh sets: the cluster's ssh first on PATH, and no binding of ranks to
    cores by Open MPI's launcher. Every machine believes the host's cores are its own,
    so bound ranks of different machines would share the same first cores, each
    busy-polling for its messages."""
    return {"PATH": f"{c.bin}:$PATH", "PRTE_MCA_hwloc_default_binding_policy": "none"}


def sent_bytes(cluster: Cluster) -> int:
    """Bytes all the cluster's machines have sent so far: their interfaces' counters."""
    total = 0
    for i in range(cluster.machines):
        found = tool("ip", "-n", cluster.netns(i), "-j", "-s", "link", "show", cluster.nic)
        total += json.loads(found.stdout)[0]["stats64"]["tx"]["bytes"]
    return total


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


def cut_off(machines: Optional[Set[str]] = None) -> List[str]:
    """The machines of the emulated clusters up on this host (of `machines` alone, where
    given and any of them is one) whose NIC is down: cut off the network by --fail
    (commbench.faults.fail_inject.cut_link); none where this process may not look."""
    try:
        namespaces = existing_netns()
    except (UsageError, OSError):
        return []
    found, made = [], clusters()
    if machines is not None and not machines & {c.machine(i) for c in made
                                                for i in range(c.machines)}:
        machines = None  # named otherwise (addresses): every machine
    for cluster in made:
        for i in range(cluster.machines):
            name = cluster.machine(i)
            if cluster.netns(i) not in namespaces or machines is not None \
                    and name not in machines:
                continue
            shown = tool("ip", "-n", cluster.netns(i), "-j", "link", "show", "dev",
                         cluster.nic, check=False)
            try:
                up = "UP" in json.loads(shown.stdout)[0]["flags"]
            except (ValueError, IndexError, KeyError):
                continue  # gone meanwhile: nothing to wait for
            if not up:
                found.append(name)
    return found


def wait_for_machines(who: str, machines: Optional[Set[str]] = None,
                      patience: float = MACHINES_PATIENCE) -> None:
    """Until the machines --fail cut off the network (of `machines`, where given) are back
    on it, at most `patience` seconds: a launcher could not reach them. Their link comes
    back after the cut's +REJOIN, or once the cut rank's process has ended."""
    deadline, said = time.monotonic() + patience, False
    while True:
        away = cut_off(machines)
        if not away:
            return
        if time.monotonic() >= deadline:
            print(f"{who}: {', '.join(away)} still cut off the network after {patience:.0f} "
                  "s; going on without waiting", file=sys.stderr, flush=True)
            return
        if not said:
            print(f"{who}: waiting for {', '.join(away)} to be back on the network (cut off "
                  "by --fail)", file=sys.stderr, flush=True)
            said = True
        time.sleep(POLL_SECONDS)


def status(cluster: Cluster) -> Dict[str, bool]:
    """Which of the cluster's pieces exist."""
    links, namespaces = existing_links(), existing_netns()
    pieces = {f"bridge {cluster.bridge}": cluster.bridge in links}
    for i in range(cluster.machines):
        pieces[f"machine {cluster.machine(i)} ({cluster.netns(i)}, {cluster.address(i)})"] = \
            cluster.netns(i) in namespaces and cluster.netns(i) in links
    return pieces
