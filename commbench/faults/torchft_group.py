"""A replica group of `--recovery torchft` (issue 56), as `commbench torchft -n N`
(commbench.faults.torchft_launch) starts each: one process, a torch.distributed world of
its own (commbench's own collectives, evaluation and the result's gathering, stay
inside it), joined to the other groups by torchft's Manager alone. The strategy's
exchange is torchft's (commbench.faults.torchft_exchange): allreduce's quorum is formed
before every step, local_sgd's and diloco's at every H-th step's sync; the Manager
commits a quorum step only where every group's allreduce went through, and a group
started again after a failure recovers the model, the optimizers (DiLoCo's outer one
and its last sync's parameters too) and where training stood live from a peer
(torchft's checkpoint transport) as it joins a quorum, and takes up the loop there.

Each group scores its own model on the whole validation set: the groups hold the same
parameters after every committed quorum step (the same averages, or a peer's state),
where the evaluations fall (torchft_exchange), but BatchNorm's running statistics are
each group's own, so their scores differ a little. Group 0's decides where every group
stops (`verdict`): group 0 writes the result, and the schedule of --fail never fails it.
--fail's RANK is a replica group: the schedule is expanded over the N groups, as over N
ranks of mpiexec."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from commbench.errors import UsageError
from commbench.faults import checkpoint, fail_schedule, torchft_costs, torchft_exchange
from commbench.faults.recovery_hook import Progress, Recovery
from commbench.faults.restart import RECORD, read, write
from commbench.launch.detect import REPLICA_GROUP
from commbench.faults.torchft_costs import StepRecord, cost, short_quorums
from commbench.faults.torchft_fixes import checkpoint_transport

if TYPE_CHECKING:  # pragma: no cover
    from commbench.config.run_config import RunConfig
    from commbench.launch.detect import LaunchInfo

# Set by `commbench torchft` for each group it starts.
GROUP = REPLICA_GROUP  # this group's index, the RANK of --fail
GROUPS = "COMMBENCH_TORCHFT_GROUPS"  # how many groups the launcher runs
STARTS = "COMMBENCH_TORCHFT_STARTS"  # how many times this group was started before
RECORDS = "COMMBENCH_TORCHFT_RECORDS"  # where a failing group records its event
ENDED = "ended-"  # + group + RECORD: a group's parameters' digest at its end
VERDICT = "verdict-"  # + step + RECORD: whether group 0 stops at that evaluation


def identity(rank: int, world_size: int) -> Tuple[int, int]:
    """(this worker's index, how many workers): the replica group's under `commbench
    torchft`, the launcher's rank otherwise."""
    if GROUPS not in os.environ:
        return rank, world_size
    return int(os.environ[GROUP]), int(os.environ[GROUPS])


def as_worker(ctx):
    """ctx with the replica group's index and count as its rank and world size: what
    splits the data among the workers and places --fail's events."""
    rank, size = identity(ctx.rank, ctx.world_size)
    return dataclasses.replace(ctx, launch=dataclasses.replace(ctx.launch, rank=rank,
                                                               world_size=size))


def check(config: "RunConfig", launch: "LaunchInfo", strategy_cls) -> None:
    """UsageError, before anything starts, for a torchft run that could not be one."""
    if GROUPS not in os.environ or launch.world_size != 1:
        raise UsageError("argument --recovery: torchft runs each worker as a replica group "
                         "of its own, which `commbench torchft -n N -- RUN FLAGS` starts "
                         "(a launcher's ranks share one job, which a lost rank ends)")
    torchft_exchange.check(config, strategy_cls)
    groups = int(os.environ[GROUPS])
    fail_schedule.check(config.fail, groups, f"this job of {groups} replica groups",
                        restarts=True)
    first = next((e for e in fail_schedule.schedule(config.fail, groups) if e.rank == 0), None)
    if first is not None:
        raise UsageError(f"argument --fail: {first} fails replica group 0, which writes the "
                         "result; fail another")


def fired_record(records: Path, index: int) -> Path:
    """Where the group failing by the schedule's event `index` records it, first."""
    return records / f"fired-{index}{RECORD}"


class Replica(Recovery):
    """This replica group's part in the quorum: the Manager, the step it wraps, where
    training stood (served to a peer that heals from it), and its log of the quorum's
    steps (one per step under allreduce, one per sync under local_sgd and diloco)."""

    def __init__(self, config: "RunConfig", ctx, say: Callable[[str], None],
                 samples_per_step: int, strategy) -> None:
        self.group, self.groups = identity(ctx.rank, ctx.world_size)
        self.config, self.say, self.samples_per_step = config, say, samples_per_step
        self.strategy, self.exchange = strategy, torchft_exchange.of(strategy)
        self.records = Path(os.environ[RECORDS])
        self.events = list(fail_schedule.schedule(config.fail, self.groups))
        super().__init__()
        self.progress = Progress()
        self.synced = Progress()  # where training stood after the last committed sync
        self._taken = time.perf_counter()  # when `progress` was taken
        self.log: List[StepRecord] = []
        self.began = time.time()
        self.manager = None
        self.trained: Tuple[Any, Any] = (None, None)  # the model and optimizer it serves
        self._healed: Optional[Progress] = None
        self.drawn, self.behind, self.skip = 0, 0, lambda: None  # batches drawn: `healed`
        self._quorum: Optional[bool] = None  # whether this step's sync committed; None: none

    def wrap(self, model, optimizer):
        """The training step, its exchange torchft's (commbench.faults.torchft_exchange),
        each of its quorum's steps logged."""
        from torch.distributed import TCPStore
        from torchft import Manager, ProcessGroupGloo

        patience = timedelta(seconds=self.config.timeout)
        self.trained = (model, optimizer)
        # The Manager's own store, served here: commbench's rendezvous store does not
        # outlive the start-up, and the Manager connects to its store as a client.
        # Every address the Manager gives its peers (its store, its server, where its
        # state is fetched) is the launcher's MASTER_ADDR: the group's machine's own.
        host = os.environ["MASTER_ADDR"]
        self.store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
        # Synchronous quorum: a group that heals loads its peer's state as the quorum
        # forms, so that the step (or the sync) it then takes is the quorum's.
        quorum = ProcessGroupGloo(timeout=patience)
        self.manager = Manager(quorum, self.load, self.state, min_replica_size=1,
                               use_async_quorum=False, timeout=patience,
                               quorum_timeout=patience, rank=0, world_size=1,
                               store_addr=host, store_port=self.store.port, hostname=host,
                               checkpoint_transport=checkpoint_transport(host, patience),
                               replica_id=f"commbench_{self.group}")
        # Every torchft class ends its quorum's step with should_commit: the one place
        # that sees each, whichever class asked for the quorum.
        self.manager.should_commit = self._logged(self.manager.should_commit)
        self.manager.allreduce = torchft_exchange.counted(self.manager.allreduce, quorum)
        step = torchft_exchange.wrap(self.manager, model, optimizer, self.strategy)

        def stepped(images, labels):
            self._quorum, self.drawn = None, self.drawn + 1
            began = time.perf_counter()
            loss = step(images, labels)
            if self._healed is not None:  # the peer's clock, on to this step's end
                self._healed = dataclasses.replace(self._healed, wall_seconds=(
                    self._healed.wall_seconds + time.perf_counter() - began))
            if self._quorum is False and not self.exchange.keeps_own and self._healed is None:
                self._healed = self._undone()
            return loss

        return stepped

    def _logged(self, should_commit: Callable[..., bool]) -> Callable[..., bool]:
        def logged(timeout=None) -> bool:
            committed = should_commit(timeout)
            self._quorum = committed
            self.log.append(StepRecord(time.time(), self.manager.current_step(),
                                       self.manager.num_participants(), committed))
            if self.exchange.meets:  # the quorum's count: a group that heals takes it up
                self.strategy.meetings = self.manager.current_step()
            return committed

        return logged

    def _undone(self) -> Progress:
        """Where training stands once an uncommitted sync put the parameters back to the
        last committed one's: its steps undone, its time spent."""
        wall = self.progress.wall_seconds + time.perf_counter() - self._taken
        return Progress(self.synced.steps, self.progress.training_seconds, wall,
                        self.synced.curve, self.synced.losses)

    def state(self) -> Dict[str, Any]:
        """What a peer that heals from this group loads (beside DiLoCo's own outer optimizer
        and last sync's parameters): the model, the optimizer, where training stood and
        its shard's position (as text: torchft's transport carries tensors and strings)."""
        model, optimizer = self.trained
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "progress": json.dumps(dataclasses.asdict(self.progress)),
                "drawn": str(self.drawn)}  # its shard's position: a batch a step taken

    def load(self, found: Dict[str, Any]) -> None:
        """A peer's state, as this group heals; the loop takes up its progress."""
        model, optimizer = self.trained
        model.load_state_dict(found["model"])
        optimizer.load_state_dict(found["optimizer"])
        self._healed = Progress(**json.loads(found["progress"]))
        self.behind = int(found["drawn"])  # where `healed` skips this group's shard to

    def begin(self, fails, model, optimizer, skip: Callable[[], Any]) -> Progress:
        """Started again after a failure: this group's events that fired before are not
        fired again; each one that fires is recorded first. Training starts at step 0
        here; a group that joins late takes up its peers' step as it heals, and skips its
        shard to its peer's position (`healed`)."""
        mine = [e for e in self.events if e.rank == self.group]
        fails.forget(mine[:int(os.environ.get(STARTS, "0"))])
        fails.record, fails.survived = self.fired, True  # the quorum goes on
        self.skip = skip
        self._taken = time.perf_counter()  # the loop's wall clock starts now
        return self.start

    def fired(self, event: fail_schedule.FailEvent, steps: int) -> None:
        """The failing group, before it dies: its event, after how many steps (its own,
        and the quorum's step number), when."""
        write(fired_record(self.records, self.events.index(event)), {
            "event": str(event), "rank": event.rank, "steps": steps, "at": time.time(),
            "quorum_step": self.manager.current_step()})

    def healed(self) -> Optional[Progress]:
        """Where training stood at the peer this group just healed from, or after a sync
        that undid its steps (once); or None."""
        found, self._healed = self._healed, None
        for _ in range(self.behind - self.drawn):  # to its peer's position in its shard
            self.skip()
        self.drawn, self.behind = max(self.drawn, self.behind), 0
        return found

    def committed(self) -> bool:
        """Whether the last step changed the model (a step whose quorum did not commit
        changed nothing, except local_sgd's, whose own update stands)."""
        return self._quorum is not False or self.exchange.keeps_own

    def after_step(self, progress: Progress) -> None:
        """After each step that counts: where training stands, for a peer that heals."""
        self.progress = progress
        self._taken = time.perf_counter()
        if self._quorum:
            self.synced = self.progress

    def agreed(self, steps: int, stopped_by: Optional[str]) -> Optional[str]:
        """Group 0's verdict at this evaluation, on every group."""
        return verdict(self.records, self.group, steps, stopped_by, self.config.timeout)

    def ended(self, steps: int, model) -> bool:
        """Every group, at its run's end: its parameters recorded, for the launcher to
        compare. Whether this group writes the result (group 0 alone)."""
        write(self.records / f"{ENDED}{self.group}{RECORD}",
              {"steps": steps, "parameters_sha256": checkpoint.parameters_digest(model)})
        return self.group == 0

    def facts(self, outcome: Dict[str, Any], model) -> Dict[str, Any]:
        """Group 0, once training ended: what the failures cost and the goodput, over its
        own clock or the loop's, ahead where it healed from a peer that began earlier."""
        wall = max(time.time() - self.began,
                   self.progress.wall_seconds + time.perf_counter() - self._taken)
        fired = [f for f in (read(fired_record(self.records, i))
                             for i in range(len(self.events))) if f]
        per_quorum_step = self.samples_per_step * self.exchange.every
        samples = self.manager.batches_committed() * per_quorum_step
        return {"policy": "torchft", "replica_groups": self.groups,
                "lighthouse": os.environ.get("TORCHFT_LIGHTHOUSE"),
                "costs": [cost(f, self.log, self.samples_per_step, self.exchange.every)
                          for f in fired],
                "short_quorums_before_failures": short_quorums(fired, self.log, self.groups),
                "wall_seconds": wall, "goodput": samples / wall,
                "wall_time_to_target": wall if outcome.get("reached") else None,
                "final_model_sha256": checkpoint.digest(model),
                "final_parameters_sha256": checkpoint.parameters_digest(model)}

    def lines(self, facts: Optional[Dict[str, Any]], rate: Optional[float],
              unit: str) -> List[str]:
        return torchft_costs.lines(facts, rate, unit)


def verdict(records: Path, group: int, steps: int, stopped_by: Optional[str],
            patience: float, poll: float = 0.05) -> Optional[str]:
    """Why training stops at the evaluation after `steps` steps, group 0's word for
    every group: group 0 records its own; another waits up to `patience` seconds for it
    (the groups keep in step through the quorum: it comes once group 0 has scored), lest
    a group whose own score reached the target first end alone."""
    path = records / f"{VERDICT}{steps}{RECORD}"
    if group == 0:
        write(path, {"stopped_by": stopped_by})
        return stopped_by
    deadline = time.monotonic() + patience
    while True:
        found = read(path)
        if found is not None:
            return found["stopped_by"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"replica group 0 did not say within --timeout ({patience:g} s) "
                               f"whether training stops at step {steps}")
        time.sleep(poll)


def ended_alike(records: Path, groups: int) -> Optional[str]:
    """What the launcher says of the groups' parameters once every group ended its run
    (None where one did not)."""
    ended = [read(records / f"{ENDED}{g}{RECORD}") for g in range(groups)]
    if not all(ended):
        return None
    digests = {e["parameters_sha256"] for e in ended}
    steps = sorted({e["steps"] for e in ended})
    if len(digests) == 1:
        return (f"the {groups} replica groups ended at step {steps[0]} with the same "
                f"parameters (sha256 {digests.pop()[:16]})")
    return (f"the {groups} replica groups ended at step {', '.join(map(str, steps))} with "
            f"{len(digests)} different parameters (local_sgd's and diloco's agree right "
            "after a committed sync alone)")
