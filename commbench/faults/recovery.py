"""The recovery policy of a run, `--recovery` (issue 56): what the job does when a rank
fails. `none` (the default): the job ends, as any lost rank ends it. `restart`: the job
checkpoints every --checkpoint-every steps (commbench.faults.checkpoint), and when a rank
fails the launcher starts every rank again — torchrun's elastic agent (`torchrun
--max-restarts N`) or, under an MPI launcher, `commbench supervise` — and training
resumes from the newest complete checkpoint of this job (commbench.faults.restart).
`torchft` (commbench.faults.torchft_group): survivors go on in torchft's quorum.
`gossip` (commbench.faults.gossip_recovery): neighbor_allreduce's (and the hierarchical
one's) survivors mix around a lost rank and go on.

A job's checkpoints live in a directory named for its identity, the digest of its flags
(the output locations aside) and world size, so that a run never resumes another run's
checkpoint. Only a run trained to accuracy restarts: a speed run would time the steps
it redoes."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional

from commbench.config.compression import of as sent_as, parse as compression
from commbench.config.flags import flag, one_of, positive_int
from commbench.config.sections import Section
from commbench.errors import UsageError
from commbench.faults import fail_schedule
from commbench.launch.detect import REJOINING
from commbench.launch.gpus import torch_older_than

if TYPE_CHECKING:  # pragma: no cover
    from commbench.config.run_config import RunConfig
    from commbench.launch.detect import LaunchInfo

POLICIES = ("none", "restart", "torchft", "gossip")
# The strategies whose survivors mix around a lost rank under --recovery gossip.
GOSSIPING = ("neighbor_allreduce", "hierarchical_neighbor_allreduce")
CHECKPOINT_EVERY = 20
# Set by `commbench supervise` for the launcher it runs (commbench.faults.supervise): the
# restarts it allows, and when it saw the last attempt end (the failure's detection).
SUPERVISED = "COMMBENCH_SUPERVISE_RESTARTS"
DETECTED = "COMMBENCH_FAILURE_DETECTED_AT"
# Set by `commbench gossip` for the launcher it runs (commbench.faults.gossip_launch):
# something starts a rank again after its +REJOIN under --recovery gossip.
GOSSIP_SUPERVISED = "COMMBENCH_GOSSIP_SUPERVISED"
# Where a job's checkpoints are kept does not change what it trains.
NOT_IDENTITY = ("results_dir", "checkpoint_dir")


@dataclass(frozen=True)
class RecoveryFlags(Section):
    title = "recovery from failures"

    recovery: str = flag(
        "none", "what the job does when a rank fails: none (the job ends) or restart "
        "(checkpoints every --checkpoint-every steps; the launcher starts every rank again, "
        "torchrun --max-restarts N or `commbench supervise` around an MPI launcher, and "
        "training resumes from the newest complete checkpoint) or torchft (each worker a "
        "replica group of torchft's quorum, started by `commbench torchft -n N -- ...`; "
        "survivors go on, a restarted group heals from a peer) or gossip (neighbor_allreduce "
        "under mpiexec: survivors mix around a lost rank and go on)", one_of(POLICIES),
        "{none,restart,torchft,gossip}")
    checkpoint_every: int = flag(
        CHECKPOINT_EVERY, "--recovery restart: checkpoint every N training steps",
        positive_int, "STEPS")
    checkpoint_dir: Optional[str] = flag(
        None, "--recovery restart: where the job's checkpoints go, one directory per job "
        "(default: RESULTS_DIR/checkpoints)", metavar="DIR")

    @classmethod
    def unread(cls, config) -> Dict[str, str]:
        moot = {} if config.recovery == "restart" else dict.fromkeys(
            ("checkpoint_every", "checkpoint_dir"),
            "checkpoints are taken for --recovery restart alone: leave it out")
        if config.recovery == "none" or config.trains_to_accuracy:
            return moot
        why = {"restart": "a restart would time the steps it redoes: restart",
               "torchft": "torchft's quorum would change the world size it times: recover",
               "gossip": "gossip's survivors would change the world size it times: recover"}[
            config.recovery]
        return {**moot, "recovery": f"a speed run times its steps, and {why} a run "
                "trained to accuracy (--target-accuracy, --max-epochs, --time-budget or "
                "--eval-every)"}


def check(config: "RunConfig", launch: "LaunchInfo", strategy_cls) -> None:
    """UsageError, before any communication, for a restart that could not resume the
    strategy exactly or that nothing would start again (gossip's: check_gossip)."""
    if config.recovery != "restart":  # torchft's are commbench.faults.torchft_group's
        return
    if not strategy_cls.restartable:
        raise UsageError(f"argument --recovery: {strategy_cls.name} keeps state of its own "
                         "between steps, which a checkpoint of the model and the optimizer "
                         "would not resume; restart allreduce or none")
    if compression(config.compression).kind == "powersgd":
        raise UsageError("argument --recovery: PowerSGD's error feedback is state of its "
                         "own, which a checkpoint of the model and the optimizer would not "
                         "resume; restart allreduce without --compression powersgd")
    if launch.launcher == "torchrun":
        if os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") == "0":
            raise UsageError("argument --recovery: restart needs torchrun to start the "
                             "workers again after a failure: torchrun --max-restarts N "
                             "(N >= 1)")
    elif SUPERVISED not in os.environ:
        raise UsageError("argument --recovery: restart needs something to start the job "
                         "again after a failure: `commbench supervise --restarts N -- "
                         "mpiexec ...` around the launcher, or torchrun --max-restarts N")
    failures = len(fail_schedule.schedule(config.fail, launch.world_size))
    allowed = restarts_allowed()
    if allowed is not None and failures > allowed:
        raise UsageError(f"argument --fail: {failures} failures, but the launcher starts the "
                         f"job again {allowed} time{'s' if allowed != 1 else ''} at most "
                         "(torchrun --max-restarts, commbench supervise --restarts): allow "
                         "as many restarts")
    if torch_older_than(2, 2):
        import torch

        raise UsageError("argument --recovery: restart checkpoints through torch.distributed."
                         "checkpoint's state-dict API, which needs torch >= 2.2; this is "
                         f"torch {torch.__version__}")


def check_gossip(config: "RunConfig", launch: "LaunchInfo", strategy_cls) -> None:
    """What --recovery gossip needs: neighbor averaging over gloo, under an MPI launcher
    that keeps the others running (the mpirun front adds --enable-recovery), and a
    schedule that leaves rank 0, which serves the store the survivors meet in."""
    if strategy_cls.name not in GOSSIPING:
        raise UsageError(f"argument --recovery: gossip needs a strategy that averages with "
                         f"neighbors, --dist-optimizer {' or '.join(GOSSIPING)}; "
                         f"{strategy_cls.name} cannot go on around a lost rank")
    machines_of = config.machine_size or launch.local_size
    if strategy_cls.name == GOSSIPING[1] and sent_as(config).on and machines_of > 1:
        raise UsageError(f"argument --compression: {GOSSIPING[1]}'s survivors send their "
                         f"parameters at full precision; pass --compression none (or "
                         f"{GOSSIPING[0]})")
    if config.cpu_transport != "gloo":
        raise UsageError("argument --recovery: gossip's survivors wait on each message "
                         "through gloo (an MPI message to a lost rank ends the job): pass "
                         "--cpu-transport gloo")
    events = fail_schedule.schedule(config.fail, launch.world_size)
    if any(e.rank == 0 for e in events):
        raise UsageError("argument --fail: rank 0 serves the store gossip's survivors meet "
                         "in and never fails under --recovery gossip; fail another rank")
    rejoins = next((e for e in events if e.rejoin is not None), None)
    if rejoins is not None and GOSSIP_SUPERVISED not in os.environ \
            and launch.launcher != REJOINING:
        raise UsageError(f"argument --fail: {rejoins} rejoins, but nothing starts rank "
                         f"{rejoins.rank} again: run the job under `commbench gossip -- "
                         "mpiexec ...`")
    if not launch.mpi and launch.launcher != REJOINING:
        raise UsageError("argument --recovery: gossip needs an MPI launcher that keeps the "
                         "others running when a rank dies: mpiexec --enable-recovery -n N "
                         "python -m commbench ...")


def check_cut(config: "RunConfig") -> None:
    """What a cut (--fail ...:cut) needs: an emulated machine whose link this rank may take
    down (a replica group's: `commbench torchft --cluster`), and a policy that outlives
    it: none, restart, or torchft with +REJOIN (the link comes back after +REJOIN, or
    when the cut rank's process has ended, commbench.faults.fail_inject)."""
    from commbench.result.environment import emulated_network

    cut = fail_schedule.first_of_kind(config.fail, "cut")
    if cut is None:
        return
    if config.recovery == "gossip":
        raise UsageError(f"argument --fail: {cut} under --recovery gossip: Open MPI ends the "
                         "job when it loses the cut machine's daemon, --enable-recovery or "
                         "not, so the survivors could not go on; kill or stop the rank "
                         "instead")
    if not (emulated_network() or {}).get("nic"):
        raise UsageError(f"argument --fail: {cut} takes the rank's machine off the network, "
                         "which commbench does only on an emulated cluster's machines "
                         "(commbench sweep --emulate, or mpirun on those of `commbench cluster "
                         "up`); here kill or stop the rank")
    if os.geteuid() != 0:
        raise UsageError(f"argument --fail: {cut} takes a network interface down, which needs "
                         "root, as the emulated cluster did")
    parsed = fail_schedule.parse(config.fail)
    cuts = [parsed] if isinstance(parsed, fail_schedule.RandomSchedule) else \
        [e for e in parsed if e.kind == "cut"]
    forever = next((c for c in cuts if c.rejoin is None), None)
    if config.recovery == "torchft" and forever is not None:
        raise UsageError(f"argument --fail: {forever} under --recovery torchft needs +REJOIN "
                         "(rejoin= in a random schedule): the cut group rejoins the quorum "
                         "once its link is back, which without it is only when its process "
                         "has ended")


def after_failure(policy: str) -> str:
    """What the console says the job does after each failure of --fail."""
    return {"restart": "the job restarts from its newest checkpoint after each (--recovery "
                       "restart)",
            "torchft": "the others go on in torchft's quorum, and the failed replica group "
                       "is started again and heals from a peer (--recovery torchft)",
            "gossip": "after each, the lost rank's neighbors mix around it and the others "
                      "go on (--recovery gossip)"}.get(
        policy, "with no recovery policy the first one ends the job")


def job_dir(config: "RunConfig", world_size: int) -> Path:
    """The directory of this job's checkpoints and failure records: one per identity."""
    from commbench import __version__

    flags = {k: v for k, v in config.to_dict().items() if k not in NOT_IDENTITY}
    text = json.dumps([__version__, world_size, flags], sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    root = config.checkpoint_dir or str(Path(config.results_dir) / "checkpoints")
    return Path(root) / f"job-{digest}"


def restarts_allowed() -> Optional[int]:
    """How many restarts the launcher allows (None: not known here)."""
    text = os.environ.get("TORCHELASTIC_MAX_RESTARTS", os.environ.get(SUPERVISED))
    return int(text) if text and text.isdigit() else None
