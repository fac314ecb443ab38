"""The `ssh` of an emulated cluster: `ssh [options] HOST COMMAND...` runs COMMAND in
HOST's namespaces (its network, its hostname, its /etc/hosts), as ssh would run it on
that machine: through the user's shell, with the words of COMMAND joined by spaces.

It is first on the PATH of a shell that sourced the cluster's env.sh, so every launcher
that reaches machines through ssh (Open MPI's daemons, horovodrun's host check and its
gloo launcher, bfrun) reaches the emulated ones, with no launcher-specific agent.
ssh's options are accepted and ignored: there is no remote login to configure.

Inside a machine the environment is the caller's (one host, one filesystem), plus
COMMBENCH_EMULATED_NETWORK (what results record, and how ranks know they share the
host's cores with every other machine) and GLOO_SOCKET_IFNAME (the machine's NIC).

Like ssh, it stays on the launching host until the command ends, and exits with its
status, or 255 when the command was killed (everything on the machine died): a
launcher learns from that that its remote daemon is gone, as from a real ssh.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple

# ssh(1) options that take a value; any other option is a flag (letters may combine).
WITH_VALUE = set("BbcDEeFIiJLlmOopQRSWw")


def split(argv: List[str]) -> Tuple[Optional[str], List[str]]:
    """(host, command words) of an ssh command line. Like OpenSSH, options may also
    follow the host (horovodrun writes `ssh -o ... HOST -p PORT ... COMMAND`)."""
    host, i = None, 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            if host is None and i < len(argv):
                host, i = argv[i], i + 1
            break
        if word.startswith("-") and len(word) > 1:
            letters = word[1:]
            for j, letter in enumerate(letters):
                if letter in WITH_VALUE:
                    i += 1 if j + 1 < len(letters) else 2  # -p22 or -p 22
                    break
            else:
                i += 1
        elif host is None:
            host, i = word, i + 1
        else:
            break
    if host is None:
        return None, []
    return host.rsplit("@", 1)[-1], argv[i:]


def main() -> None:
    from commbench.cluster.state import load

    directory = Path(os.path.abspath(sys.argv[0])).parent.parent
    cluster = load(directory.name)
    host, words = split(sys.argv[1:])
    if cluster is None:
        fail(f"the emulated cluster of {directory} is down (commbench cluster status)")
    if host is None:
        fail("usage: ssh [options] HOST [COMMAND...]")
    shell = os.environ.get("SHELL") or "/bin/sh"
    command = " ".join(words) if words else f"exec {shell} -l"
    names = {cluster.machine(i): i for i in range(cluster.machines)}
    names.update({cluster.address(i): i for i in range(cluster.machines)})
    if host in names:
        i = names[host]
        env = dict(os.environ, **cluster.machine_environment())
        sys.exit(remote([*cluster.enter(i), shell, "-c", command], env))
    if host in ("localhost", "127.0.0.1", cluster.host_address, socket.gethostname()):
        os.execvp(shell, [shell, "-c", command])
    fail(f"Could not resolve hostname {host}: not a machine of emulated cluster "
         f"{cluster.name} ({cluster.hosts})")


def remote(argv: List[str], env: dict) -> int:
    """Run a machine's command from the host, as ssh runs a remote one; the signals ssh
    passes on (INT, TERM, HUP) go on to it. Its exit status, 255 if it was killed."""
    command = subprocess.Popen(argv, env=env, close_fds=False)

    def pass_on(signo, _frame):
        try:
            command.send_signal(signo)
        except ProcessLookupError:
            pass

    for signo in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signo, pass_on)
    code = command.wait()
    return code if code >= 0 else 255


def fail(message: str) -> None:
    print(f"ssh: {message}", file=sys.stderr)
    sys.exit(255)
