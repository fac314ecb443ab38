"""Where `commbench torchft` places its replica groups and its lighthouse: on this host's
loopback, or with --cluster NAME on the machines of an emulated cluster (commbench
cluster up, commbench.cluster): group g on machine g, started in its namespaces and
given that machine's address alone, the lighthouse on machine 0. Then every byte the
groups exchange (the quorum, the allreduce, a healing group's fetch of its peer's
state) crosses the emulated links, and the result records the cluster as a run of
mpirun on its machines does."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional
from urllib.parse import urlsplit

from commbench.cluster import namespaces
from commbench.cluster.host import check_privileges
from commbench.cluster.state import Cluster, load
from commbench.errors import UsageError

LOOPBACK = "127.0.0.1"
PATIENCE = 15.0  # seconds a lighthouse started on machine 0 gets to answer


@dataclass(frozen=True)
class Placement:
    """Where each replica group runs: what its command line starts with, the address it
    is given (its store's, its Manager's, where peers fetch its state), and what its
    environment adds. No cluster: this host, on its loopback."""

    cluster: Optional[Cluster] = None

    def prefix(self, group: int) -> List[str]:
        return [] if self.cluster is None else self.cluster.enter(group)

    def address(self, group: int) -> str:
        return LOOPBACK if self.cluster is None else self.cluster.address(group)

    def environment(self) -> Dict[str, str]:
        return {} if self.cluster is None else self.cluster.machine_environment()


def placement(name: Optional[str], groups: int, lighthouse: Optional[str],
              needs: str = "replica groups (one on each)") -> Placement:
    """This host's loopback, or cluster `name`'s machines, one per group; refused in one
    line without the privileges to enter them, where the cluster is not up (or no
    longer whole) or is short of the `groups` machines it `needs` (the refusal's words),
    or where a given lighthouse is on a loopback they cannot reach."""
    if name is None:
        return Placement()
    check_privileges()
    cluster = load(name)
    if cluster is None:
        raise UsageError(f"argument --cluster: no emulated cluster {name} is up (commbench "
                         f"cluster up --name {name} --machines {groups})")
    if cluster.machines < groups:
        raise UsageError(f"argument --cluster: cluster {name} has {cluster.machines} "
                         f"machine(s), fewer than the {groups} {needs}")
    if lighthouse is not None and on_loopback(lighthouse):
        raise UsageError(f"argument --lighthouse: {lighthouse} is on this host's loopback, "
                         f"which the machines of cluster {name} cannot reach: give its "
                         f"address on the cluster's bridge, {cluster.host_address}")
    missing = [piece for piece, there in namespaces.status(cluster).items() if not there]
    if missing:
        raise UsageError(f"argument --cluster: cluster {name} is down ({missing[0]} is "
                         f"missing): commbench cluster down --name {name}, then up again")
    return Placement(cluster)


def on_loopback(address: str) -> bool:
    host = urlsplit(address if "//" in address else f"http://{address}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: whether the machines resolve it is theirs to say


@contextlib.contextmanager
def lighthouse_on(cluster: Cluster, port: int) -> Iterator[str]:
    """torchft's lighthouse on machine 0, listening on its address at `port`: its
    address once it answers. It is ended when the block ends."""
    here = Path(sys.executable).parent  # the environment's own, first
    program = shutil.which("torchft_lighthouse", path=f"{here}{os.pathsep}"
                                                      f"{os.environ.get('PATH', '')}")
    if program is None:
        raise UsageError("torchft_lighthouse not found: install torchft")
    address = cluster.address(0)
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen([*cluster.enter(0), program, "--bind", f"{address}:{port}",
                                 "--min_replicas", "1"], stdout=subprocess.DEVNULL,
                                stderr=errors)
        try:
            answering(proc, errors, address, port, cluster.machine(0))
            yield f"http://{address}:{port}"
        finally:
            proc.kill()
            proc.wait()


def answering(proc: subprocess.Popen, errors, address: str, port: int, machine: str) -> None:
    """Wait for the lighthouse to accept connections; one line if it ends or does not."""
    deadline = time.monotonic() + PATIENCE
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    errors.seek(0)
    said = errors.read().decode(errors="replace").strip().splitlines()
    why = said[-1] if said else ("exit status %s" % proc.returncode if proc.poll() is not None
                                 else f"no answer in {PATIENCE:g} s")
    raise UsageError(f"torchft's lighthouse on {machine} ({address}:{port}) did not start: "
                     f"{why}")
