"""The lost-machine policy, in one place: how a job with ranks on several machines ends
when one machine stops answering (its link down or stalled, or all on it dead), under
Open MPI 5's launcher (PRRTE 3.0). Both sides read it: a rank
(commbench.job.failure, through launcher_first) and the mpirun front
(commbench.launch.mpirun_front), which `commbench setup-mpirun` installs.

PRRTE needs three things for a lost machine to end the job:
- a keepalive on its connections to the daemons short enough to notice the loss
  (PRRTE_KEEPALIVE: at most LOST_MACHINE_SECONDS, 20 s, against PRRTE's 8 minutes),
  which `setup-mpirun` writes into PRRTE's default parameter file <prefix>/etc/
  prte-mca-params.conf, so that plain `mpirun`, horovodrun and bfrun (and each daemon,
  which reads the same file) get it; settings of a user's own, in that file, in
  ~/.prte/mca-params.conf or as PRTE_MCA_* variables, win;
- an exit status: PRRTE reports the lost daemon ("PRTE has lost communication with a
  remote daemon ... on node NAME") and then exits 0 (the lost-daemon path of
  errmgr_dvm.c's proc_errors never sets prte_exit_status). The front therefore runs
  the real mpirun as its child, passes its standard error through (LostDaemons notes
  the reports), and turns an exit status of 0 after that report into 1, with one line
  naming the lost machines;
- an end to waiting: PRRTE ends its job only when every daemon has confirmed, and a
  lost daemon never does. A first SIGTERM/SIGINT/SIGHUP starts that clean end, a
  second only says "Abort is in progress", the third kills mpirun's own children and
  exits. The front passes signals on (those from the terminal reach mpirun directly)
  and, when mpirun has not ended FORCE_AFTER seconds after one, sends the other two.
  (A signal sent to the whole process group, or by Slurm to every process of a step,
  reaches mpirun twice: for these three, PRRTE's second only prints.)

And a rank that got no answer from a peer, with peers on other machines, first leaves
mpirun time to notice a lost machine (launcher_first) before it ends the job itself.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import List

# Open MPI 5's launcher (PRRTE) learns that a machine stopped answering (its network
# went down or stalled, or everything on it died) from the TCP keepalive of its
# connection to the daemon there: with PRRTE's defaults (300 s idle, then 9 probes 20 s
# apart) after 8 minutes, with these settings of its OOB after at most 20 s.
# `commbench setup-mpirun` writes them into PRRTE's default parameter file.
PRRTE_KEEPALIVE = (("oob_tcp_keepalive_time", 5), ("oob_tcp_keepalive_intvl", 3),
                   ("oob_tcp_keepalive_probes", 5))
LOST_MACHINE_SECONDS = 5 + 5 * 3
# How a rank's error says that a peer did not answer in time (gloo, TCPStore, MPI).
NO_ANSWER = re.compile(r"\btime[ds]?[ _-]?out|ETIMEDOUT", re.IGNORECASE)
# Seconds the front leaves mpirun after a signal that should end it before it ends
# mpirun as a third Ctrl-C would.
FORCE_AFTER = 10.0

# PRRTE's report of a lost daemon on its standard error (help-errmgr-base.txt's
# node-died), and its line that names the machine. (When the ssh that started a daemon
# ends instead, plm_ssh says "A daemon failed to report back" on standard output and
# exits with ssh's status, 255 for a lost machine.)
LOST_DAEMON = b"PRTE has lost communication with a remote daemon"
LOST_MACHINE = re.compile(rb"^\s*Remote daemon:.* on node\s+(\S+)")


def launcher_first(error: BaseException, environ=os.environ) -> float:
    """Seconds to leave mpirun before this rank ends the job itself: after no answer
    from a peer, under Open MPI with ranks on other machines, LOST_MACHINE_SECONDS and
    5 more; otherwise none.

    If the silent peer's machine is lost, mpirun's keepalive notices within
    LOST_MACHINE_SECONDS, ends the job and names the machine. An abort sent first would
    never end: mpirun orders every daemon, the lost one too, to kill its ranks, and TCP
    sends no keepalive while data is unacknowledged, so mpirun waits for the kernel to
    give up retransmitting (about 15 minutes) and ignores a first SIGTERM meanwhile.
    When the peer's machine still answers, the abort follows the pause."""
    if not (isinstance(error, TimeoutError) or NO_ANSWER.search(str(error))):
        return 0.0
    try:
        spread = int(environ["OMPI_COMM_WORLD_LOCAL_SIZE"]) < int(environ["OMPI_COMM_WORLD_SIZE"])
    except (KeyError, ValueError):
        return 0.0
    return LOST_MACHINE_SECONDS + 5.0 if spread else 0.0


@dataclass
class LostDaemons:
    """PRRTE's lost-daemon reports in mpirun's standard error, and the machines they
    name, as the front reads it line by line."""

    reports: int = 0
    machines: List[str] = field(default_factory=list)

    def note(self, line: bytes) -> None:
        if LOST_DAEMON in line:
            self.reports += 1
        found = LOST_MACHINE.match(line)
        if found and self.reports:
            self.machines.append(found.group(1).decode(errors="replace"))

    def exit_status(self, name: str, code: int) -> int:
        """mpirun's exit status as the front passes it on: after a report, one line
        naming the lost machines, and 1 where mpirun exited 0."""
        if not self.reports:
            return code
        machines = ", ".join(dict.fromkeys(self.machines)) or "one of the job's machines"
        print(f"{name}: error: machine {machines} was lost (Open MPI's daemon there "
              f"stopped answering: network down or stalled for {LOST_MACHINE_SECONDS} s, "
              f"or killed); the job was ended", file=sys.stderr, flush=True)
        return 1 if code == 0 else code
