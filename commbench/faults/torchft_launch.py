"""`commbench torchft -n N [--lighthouse ADDR] -- RUN FLAGS`: a run under `--recovery
torchft` (commbench.faults.torchft_group), started in one command. It starts torchft's
lighthouse in this process (unless --lighthouse names one already running, which must
answer), then N replica groups, each `python -m commbench RUN FLAGS --recovery torchft`
as a process of its own with a torch.distributed world of one: under an MPI launcher
the groups would share one job, which a dead rank ends.

It watches the groups. One killed by --fail is started again, after its event's
+REJOIN (at once without one), and heals from a peer; one stopped (SIGSTOP) is killed
once --timeout has passed, then started again. A group that dies with no event of
--fail left to explain it ends the job, as a lost rank does; so does group 0 (which
writes the result) ending, whatever its status. The lighthouse is shut down and no
group is left running, however the command ends. Only group 0's output is shown, and
every group's errors; once every group has ended its run, whether their parameters
are the same.

With --cluster NAME the groups run on the machines of an emulated cluster, group g on
machine g, and the lighthouse on machine 0 (commbench.faults.torchft_machines)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

from commbench.config.flags import OneLineParser, positive_int
from commbench.errors import UsageError
from commbench.cluster.state import Cluster, as_on_a_machine
from commbench.faults import torchft_group, torchft_machines
from commbench.faults.fail_schedule import FailEvent, schedule

POLL = 0.1  # seconds between looks at the groups
GRACE = 30.0  # seconds the other groups get to end after group 0 has


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--replica-groups", type=positive_int, required=True,
                        metavar="N", help="how many replica groups (workers) to run")
    parser.add_argument("--lighthouse", metavar="ADDR", help="a torchft lighthouse already "
                        "running (http://HOST:PORT); default: one started for the run, here or "
                        "on machine 0 of --cluster")
    parser.add_argument("--cluster", metavar="NAME", help="run replica group g on machine g "
                        "of this emulated cluster (commbench cluster up), the lighthouse on "
                        "machine 0: their traffic crosses its links")
    parser.add_argument("group_flags", nargs=argparse.REMAINDER, metavar="-- RUN FLAGS",
                        help="the flags of `commbench run`, e.g. --target-accuracy 0.8 "
                        "--fail mtbf=60s,seed=1")


def main(args: argparse.Namespace) -> int:
    flags = args.group_flags[1:] if args.group_flags[:1] == ["--"] else list(args.group_flags)
    flags = replica_flags(flags)
    config = checked(flags, args.replica_groups, on_cluster=args.cluster is not None)
    place = torchft_machines.placement(args.cluster, args.replica_groups, args.lighthouse)
    # SIGTERM ends the command through its finally blocks: no group, no lighthouse left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # torchft's Rust side logs every quorum at INFO, torch's C++ side warns of what
    # torchft calls: the run's own lines are what the console is for.
    os.environ.setdefault("RUST_LOG", "warn")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    with tempfile.TemporaryDirectory(prefix="commbench-torchft-") as records, \
            lighthouse(args.lighthouse, place.cluster) as address:
        groups = Groups(flags, args.replica_groups, address, records,
                        schedule(config.fail, args.replica_groups), config.timeout, place)
        try:
            code = groups.run()
        finally:
            groups.end()
        alike = torchft_group.ended_alike(Path(records), args.replica_groups)
        if alike is not None:
            print(f"commbench torchft: {alike}", flush=True)
        return code


def replica_flags(flags: List[str]) -> List[str]:
    """The run flags every group gets: `--recovery torchft` added where not given."""
    given = [f for f in flags if f == "--recovery" or f.startswith("--recovery=")]
    return flags if given else [*flags, "--recovery", "torchft"]


def checked(flags: List[str], groups: int, on_cluster: bool = False):
    """The run's configuration, refused in one line (here, before any group starts) as
    each group would refuse it, and a run of one group, which no peer could heal. Groups
    on a cluster's machines are told so (Placement.environment: a --fail cut takes their
    NIC down)."""
    from commbench.job.run_checks import validate
    from commbench.launch.detect import detect_launch

    if groups < 2:
        raise UsageError("torchft: -n 1 leaves no peer to recover from; run 2 or more")
    config = run_config(flags, "torchft")
    env = group_env(0, groups, "http://localhost:1", "", 0, 1)
    if on_cluster:
        env.update(as_on_a_machine())
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        validate(config, detect_launch(env))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return config


def run_config(flags: List[str], policy: str):
    """The configuration of `commbench run FLAGS`, as a command that runs the job under
    --recovery `policy` reads it, refused in one line under another policy."""
    from commbench.config.run_config import add_run_arguments, config_from_args

    parser = OneLineParser(prog=f"commbench {policy}")
    add_run_arguments(parser)
    config = config_from_args(parser.parse_args(flags))
    if config.recovery != policy:
        raise UsageError(f"argument --recovery: commbench {policy} runs --recovery {policy}, "
                         f"not {config.recovery}")
    return config


@contextlib.contextmanager
def lighthouse(given: Optional[str], cluster: Optional[Cluster] = None,
               port: int = 0) -> Iterator[str]:
    """The lighthouse's address: the one given, once it answers, or one started for the
    run (here, on `port` or one the system picks, or on the cluster's machine 0) and shut
    down when the block ends. One started here runs threads that read the environment
    (getenv, as they log): nothing may set a variable while it runs, which could free
    what they read."""
    if given is not None:
        answers(given)
        yield given
        return
    if cluster is not None:
        with torchft_machines.lighthouse_on(cluster, free_port()) as address:
            yield address
        return
    from torchft.coordination import LighthouseServer

    # torchft_lighthouse's own defaults (as on an emulated cluster), not the Python
    # binding's 100 ms join timeout: with it, on a loaded machine, the group healing in
    # one step comes late to the next quorum, is left out of it and heals again, and so
    # on (docs/run.md, "torchft's quorum").
    server = LighthouseServer(bind=f"[::]:{port}", min_replicas=1, join_timeout_ms=60000,
                              quorum_tick_ms=100, heartbeat_timeout_ms=5000)
    try:
        yield server.address()
    finally:
        server.shutdown()


def answers(address: str, patience: float = 5.0) -> None:
    """UsageError unless something accepts connections at the lighthouse's address."""
    where = urlsplit(address if "//" in address else f"http://{address}")
    try:
        with socket.create_connection((where.hostname, where.port), timeout=patience):
            return
    except (OSError, ValueError) as error:
        why = getattr(error, "strerror", None) or str(error)
        raise UsageError(f"argument --lighthouse: nothing answers at {address} ({why}): "
                         "start torchft_lighthouse there, or leave --lighthouse out for "
                         "commbench to start one")


def group_env(group: int, groups: int, address: str, records: str, starts: int,
              port: int, host: str = torchft_machines.LOOPBACK) -> Dict[str, str]:
    """What a group's process is told: a torchrun-like world of one (its own store at
    host:port, which torchft's Manager shares), its index, the lighthouse."""
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": "0", "MASTER_ADDR": host, "MASTER_PORT": str(port),
            "TORCHFT_LIGHTHOUSE": address, torchft_group.GROUP: str(group),
            torchft_group.GROUPS: str(groups), torchft_group.STARTS: str(starts),
            torchft_group.RECORDS: records}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Groups:
    """The replica groups' processes, started, watched and started again."""

    def __init__(self, flags: List[str], n: int, address: str, records: str,
                 events: Tuple[FailEvent, ...], timeout: float,
                 place: torchft_machines.Placement = torchft_machines.Placement()) -> None:
        self.flags, self.n, self.address, self.records = flags, n, address, records
        self.events, self.timeout, self.place = events, timeout, place
        self.procs: Dict[int, subprocess.Popen] = {}
        self.starts = dict.fromkeys(range(n), 0)
        self.due: Dict[int, float] = {}  # group -> when to start it again
        self.stopped: Dict[int, float] = {}  # group -> when it was first seen stopped

    def command(self, group: int) -> Tuple[List[str], Dict[str, str]]:
        """A group's command line and environment, on its machine where it has one."""
        # A port free on this host is free on an emulated machine too: only this run's
        # processes listen there.
        env = dict(os.environ, **self.place.environment(),
                   **group_env(group, self.n, self.address, self.records,
                               self.starts[group], free_port(), self.place.address(group)))
        # Each group is a world of one, which would take every core: a share each, as
        # commbench gives the ranks of one machine (an explicit OMP_NUM_THREADS wins).
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.n)))
        return [*self.place.prefix(group), sys.executable, "-m", "commbench",
                *self.flags], env

    def start(self, group: int) -> None:
        argv, env = self.command(group)
        quiet = None if group == 0 else subprocess.DEVNULL
        self.procs[group] = subprocess.Popen(argv, env=env, stdout=quiet)
        self.starts[group] += 1

    def run(self) -> int:
        for group in range(self.n):
            self.start(group)
        while True:
            time.sleep(POLL)
            code = self.procs[0].poll()
            if code is not None:
                self.finish()
                return code
            for group in range(1, self.n):
                why = self.look_at(group)
                if why is not None:
                    print(f"commbench torchft: {why}; the job ends", file=sys.stderr,
                          flush=True)
                    return 1

    def look_at(self, group: int) -> Optional[str]:
        """Start a failed group again when due; why the job must end, or None."""
        now = time.monotonic()
        if group in self.due:
            if now >= self.due[group]:
                del self.due[group]
                self.start(group)
            return None
        proc = self.procs[group]
        if proc.poll() is None:
            return self.watch_stopped(group, proc, now)
        if proc.returncode == UsageError.exit_code:
            return f"replica group {group} refused its flags"
        mine = [e for e in self.events if e.rank == group]
        if proc.returncode == 0 or len(mine) < self.starts[group]:
            return (None if proc.returncode == 0 else
                    f"replica group {group} ended with exit status {proc.returncode} and no "
                    "failure of --fail left to explain it")
        event = mine[self.starts[group] - 1]
        if not torchft_group.fired_record(Path(self.records), self.events.index(event)).exists():
            return (f"replica group {group} ended with exit status {proc.returncode} before "
                    f"its failure of --fail ({event}) fired")
        self.due[group] = now + (event.rejoin or 0.0)
        print(f"commbench torchft: replica group {group} ended with exit status "
              f"{proc.returncode} ({event}); starting it again in {event.rejoin or 0:g} s",
              file=sys.stderr, flush=True)
        return None

    def watch_stopped(self, group: int, proc: subprocess.Popen, now: float) -> None:
        """A group stopped (SIGSTOP) for --timeout seconds is killed, to be started again."""
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] \
            if Path(f"/proc/{proc.pid}/stat").exists() else "R"
        if state != "T":
            self.stopped.pop(group, None)
        elif now - self.stopped.setdefault(group, now) >= self.timeout:
            proc.send_signal(signal.SIGKILL)
        return None

    def finish(self) -> None:
        """Group 0 has ended: the others get GRACE seconds to end too."""
        self.due.clear()
        wait_for(self.procs.values(), GRACE)

    def end(self) -> None:
        """No group is left running, nor stopped."""
        kill(self.procs.values())


def wait_for(procs: Iterable[subprocess.Popen], seconds: float) -> None:
    """Until `procs` have ended, or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))


def kill(procs: Iterable[subprocess.Popen]) -> None:
    """None of `procs` left running, nor stopped."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
