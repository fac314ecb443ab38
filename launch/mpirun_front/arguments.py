"""The front's respelling of mpirun's arguments: Open MPI 4's one-dash -bind-to,
-map-by and -rank-by, which Open MPI 5 rejects, as Open MPI 5's two-dash options;
only among mpirun's own options, never in the program's arguments. And a job that asks
for `--recovery gossip` gets `--enable-recovery`, without which PRRTE ends the whole job
when one process dies, before the survivors could go on (commbench.faults.gossip_recovery)."""

from __future__ import annotations

from typing import List

# Open MPI 4 spellings that Open MPI 5's mpirun rejects.
OPEN_MPI_4 = {"-bind-to": "--bind-to", "-map-by": "--map-by", "-rank-by": "--rank-by"}
# mpirun's options that take values (in either spelling), so the scan knows where
# the program starts. An option missing here is taken as a flag: the scan may then stop
# early and leave an option as typed, but never rewrites the program's own arguments.
ONE_VALUE = {"n", "np", "c", "N", "H", "host", "hostfile", "machinefile", "default-hostfile",
             "x", "wdir", "wd", "path", "prefix", "bind-to", "map-by", "rank-by", "output",
             "output-filename", "npernode", "npersocket", "cpus-per-proc", "cpus-per-rank",
             "am", "tune", "personality", "display", "rankfile", "timeout", "launch-agent",
             "stream-buffering", "preload-files", "app", "runtime-options", "with-ft"}
TWO_VALUES = {"mca", "gmca", "prtemca", "pmixmca"}
# PRRTE's options that keep the other processes running when one dies.
KEEP_RUNNING = {"--enable-recovery", "--with-ft", "--continuous"}


def rewrite(args: List[str]) -> List[str]:
    """mpirun's arguments with the Open MPI 4 one-dash options respelled, up to the
    program, and --enable-recovery first where the program asks for --recovery gossip;
    the program and its arguments as given."""
    out, i = list(args), 0
    while i < len(out) and out[i].startswith("-") and out[i] not in ("-", "--"):
        out[i] = OPEN_MPI_4.get(out[i], out[i])
        name = out[i].lstrip("-")
        if "=" in name:
            i += 1
        elif name in TWO_VALUES:
            i += 3
        elif name in ONE_VALUE:
            i += 2
        else:
            i += 1
    program = out[i:]
    gossip = any(a == "--recovery=gossip" or (a, b) == ("--recovery", "gossip")
                 for a, b in zip(program, program[1:] + [""]))
    if gossip and not KEEP_RUNNING & {a.partition("=")[0] for a in out[:i]}:
        out.insert(0, "--enable-recovery")
    return out
