"""The host's side of an emulated cluster: the privileges it needs, its tools (`ip`,
`tc`, `unshare`, `nsenter`) run with a failure said in one line, and the links and
network namespaces that exist on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from commbench.errors import UsageError

CAP_NET_ADMIN = 12


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


def existing_links() -> set:
    return {link["ifname"] for link in json.loads(tool("ip", "-j", "link").stdout or "[]")}


def existing_netns() -> set:
    return {line.split()[0] for line in tool("ip", "netns", "list").stdout.splitlines()
            if line.strip()}
