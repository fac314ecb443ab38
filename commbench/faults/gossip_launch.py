"""`commbench gossip -- mpiexec -n N ... python -m commbench RUN FLAGS`: a job under
`--recovery gossip` whose --fail has a rank rejoin (`2@step8:kill+5s`), which nothing in
PRRTE would do: it never starts a process again. So this command runs the launcher's
line and starts the killed rank again itself, as a process of its own outside the MPI
job (after the rendezvous gossip needs only gloo and the store): rank 0 does not spawn
it, since the child would inherit a rank's OMPI_/PMIX_ environment and its start-up
would land in rank 0's timed steps.

The line is run with the store's address given (`-x MASTER_ADDR -x MASTER_PORT`, so
that rank 0 serves it where this command can reach it) and `--enable-recovery` where no
option keeps the others running. This command then watches the store: once a rank's
event of --fail fired and the survivors announced it lost, it kills what is left of it
(a stopped one) and, its +REJOIN later, starts `python -m commbench RUN FLAGS` as that
rank (commbench.launch.detect's gossip-rejoin launcher), which asks the members to
admit it (commbench.faults.gossip_rejoin). It exits with the launcher's status;
rejoined ranks get GRACE seconds to end after it, then are killed.

With --cluster NAME the line is an emulated cluster's mpirun (commbench cluster up): rank 0
serves the store on machine 0's address, and a rank is started again on the machine it
ran on, in that machine's namespaces (commbench.faults.torchft_machines.Placement), so
that its traffic crosses the emulated links as it did before."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Tuple

from commbench.errors import UsageError
from commbench.faults.fail_schedule import FailEvent, schedule
from commbench.faults.gossip_survival import PREFIX
from commbench.faults.recovery import GOSSIP_SUPERVISED
from commbench.faults.torchft_launch import free_port, kill, run_config, wait_for
from commbench.faults.torchft_machines import Placement, placement
from commbench.launch.detect import REJOIN_RANK, REJOIN_WORLD

POLL = 0.1  # seconds between looks at the store
GRACE = 30.0  # seconds a rejoined rank gets to end after the launcher has
LAUNCHERS = ("mpiexec", "mpirun")  # Open MPI's, whose -x passes a variable on
KEEP_RUNNING = ("--enable-recovery", "--with-ft", "--continuous")
ELSEWHERE = ("-H", "--host", "-host", "--hostfile", "-hostfile", "--machinefile")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("launcher_command", nargs=argparse.REMAINDER,
                        metavar="-- LAUNCHER ...", help="the launcher's line of the job, e.g. "
                        "mpiexec -n 4 python -m commbench --recovery gossip --fail "
                        "2@step8:kill+5s ...")
    parser.add_argument("--cluster", metavar="NAME", help="the line runs on the machines of "
                        "this emulated cluster (commbench cluster up): a rank is started "
                        "again on its own machine")


def main(args: argparse.Namespace) -> int:
    line = args.launcher_command[1:] if args.launcher_command[:1] == ["--"] \
        else list(args.launcher_command)
    flags = program_flags(line, elsewhere=args.cluster is not None)
    config = run_config(flags, "gossip")
    place = placement(args.cluster, machines(line), None, "machines of the line's -H list")
    port = free_port()
    env = dict(os.environ, MASTER_ADDR=place.address(0), MASTER_PORT=str(port),
               **{GOSSIP_SUPERVISED: "1"})
    # This process's store client, the job's end near, would log its lost connection
    # with torch's C++ stack: the watch ends there quietly (Rejoins.poll). Set before
    # this process imports torch (Rejoins does, later), which reads it then.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        launcher = subprocess.Popen(wrapped(line), env=env)
    except OSError as error:
        raise UsageError(f"gossip: cannot run {line[0]}: {error.strerror}")
    rejoins = Rejoins(flags, config.fail, env, port, place)
    try:
        while launcher.poll() is None:
            time.sleep(POLL)
            rejoins.poll()
        rejoins.finish()
    finally:
        rejoins.end()
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
    return launcher.wait()


def program_flags(line: List[str], elsewhere: bool = False) -> List[str]:
    """The flags after `-m commbench` in an Open MPI launcher's line, refused in one line
    where this command could not start a rank of it again (on other machines than this
    host's, unless they are an emulated cluster's: `elsewhere`)."""
    if not line:
        raise UsageError("gossip: no command to run; give it after --, e.g. commbench gossip "
                         "-- mpiexec -n 4 python -m commbench --recovery gossip ...")
    if Path(line[0]).name not in LAUNCHERS:
        raise UsageError(f"gossip: {line[0]} is not Open MPI's mpiexec or mpirun; commbench "
                         "gossip runs a job under it")
    at = next((i for i in range(len(line) - 1) if line[i:i + 2] == ["-m", "commbench"]), None)
    if at is None:
        raise UsageError("gossip: no `python -m commbench` in the launcher's line")
    host = next((a for a in line[:at] if a.partition("=")[0] in ELSEWHERE and not elsewhere),
                None)
    if host is not None:
        raise UsageError(f"gossip: {host} runs ranks on other machines, but a rank that "
                         "rejoins is started again on this one; run on this host, or on "
                         "an emulated cluster with --cluster NAME")
    return line[at + 2:]


def machines(line: List[str]) -> int:
    """How many machines the line's `-H`/`--host` list names (1 without one)."""
    at = next((i for i, a in enumerate(line[:-1]) if a in ("-H", "--host", "-host")), None)
    return 1 if at is None else len(line[at + 1].split(","))


def wrapped(line: List[str]) -> List[str]:
    """The launcher's line with the store's address passed on to every rank, and the
    others kept running when one dies."""
    keep = [] if any(a.partition("=")[0] in KEEP_RUNNING for a in line) \
        else ["--enable-recovery"]
    passed = [x for name in ("MASTER_ADDR", "MASTER_PORT", GOSSIP_SUPERVISED)
              for x in ("-x", name)]
    return [line[0], *keep, *passed, *line[1:]]


def rejoiner(flags: List[str], env: Dict[str, str], rank: int, world: int,
             place: Placement = Placement(), machine: int = 0) -> Tuple[List[str], Dict[str, str]]:
    """The command line and environment of rank `rank` started again, on `machine` of the
    placement."""
    return [*place.prefix(machine), sys.executable, "-m", "commbench", *flags], dict(
        env, **place.environment(), **{REJOIN_RANK: str(rank), REJOIN_WORLD: str(world)})


def machine_of(place: Placement, hostname: str) -> int:
    """The machine of the placement whose hostname a rank recorded (0 on this host)."""
    cluster = place.cluster
    if cluster is None:
        return 0
    return next((i for i in range(cluster.machines) if cluster.machine(i) == hostname), 0)


class Rejoins:
    """The ranks of --fail that rejoin: watched in the job's store, started again."""

    def __init__(self, flags: List[str], spec: str, env: Dict[str, str], port: int,
                 place: Placement = Placement()) -> None:
        self.flags, self.spec, self.env, self.port, self.place = flags, spec, env, port, place
        self.hosts: List[str] = []  # each rank's hostname, as the job recorded it
        self.client: Any = None  # the store, once rank 0 serves it
        self.store: Any = None  # and once rank 0 said what the job is
        self.events: Dict[int, FailEvent] = {}
        self.world = 0
        self.due: Dict[int, float] = {}  # rank -> when to start it again (wall clock)
        self.procs: Dict[int, subprocess.Popen] = {}
        self.gone = False  # whether the store's server, rank 0, has ended

    def poll(self) -> None:
        """Start again each lost rank that is due; once rank 0, which serves the store,
        has ended (and with it the job), nothing more."""
        if self.gone:
            return
        try:
            self._poll()
        except RuntimeError:  # torch's DistNetworkError, or a store slow to answer
            self.gone = not self._served()

    def _served(self) -> bool:
        """Whether something still accepts connections at the store's address."""
        try:
            socket.create_connection((self.env["MASTER_ADDR"], self.port), timeout=POLL).close()
            return True
        except OSError:
            return False

    def _poll(self) -> None:
        if self.store is None and not self._connect():
            return
        for rank, event in self.events.items():
            if rank in self.procs:
                continue
            if rank not in self.due:
                self._look_for_loss(rank, event)
            elif time.time() >= self.due[rank] and not self.store.check([f"{PREFIX}/ended"]):
                argv, env = rejoiner(self.flags, self.env, rank, self.world, self.place,
                                     machine_of(self.place, self.hosts[rank]))
                self.procs[rank] = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)

    def _connect(self) -> bool:
        """Whether rank 0 serves the store and said what the job is (Gossip's record)."""
        import torch.distributed as dist

        if self.client is None:
            if not self._served():  # asked first: torch logs each failed connection
                return False  # not served yet
            self.client = dist.TCPStore(self.env["MASTER_ADDR"], self.port, 1, False,
                                        timedelta(seconds=10), wait_for_workers=False)
        if self.client is not None and self.client.check([f"{PREFIX}/job"]):
            job = json.loads(self.client.get(f"{PREFIX}/job"))
            self.world, self.hosts = job["world_size"], job["hostnames"]
            self.events = {e.rank: e for e in schedule(self.spec, self.world)
                           if e.rejoin is not None}
            self.store = self.client
        return self.store is not None

    def _look_for_loss(self, rank: int, event: FailEvent) -> None:
        """Once the event fired and the survivors announced the rank lost: what is left
        of it killed, its start due +REJOIN after it fired."""
        if not (self.store.check([f"{PREFIX}/fired/{rank}"])
                and self.store.add(f"{PREFIX}/losses/{rank}", 0) > 0):
            return
        fired = json.loads(self.store.get(f"{PREFIX}/fired/{rank}"))
        if event.kind == "stop":  # a killed one is gone already
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(self.store.get(f"{PREFIX}/pid/{rank}")), signal.SIGKILL)
        self.due[rank] = fired["at"] + event.rejoin
        wait = max(0.0, self.due[rank] - time.time())
        print(f"commbench gossip: rank {rank} was lost ({event}); starting it again in "
              f"{wait:.1f} s", file=sys.stderr, flush=True)

    def finish(self) -> None:
        """The launcher has ended: the rejoined ranks get GRACE seconds to end too."""
        wait_for(self.procs.values(), GRACE)

    def end(self) -> None:
        """No rejoined rank is left running."""
        kill(self.procs.values())
