"""`--recovery gossip` (issue 56): neighbor_allreduce's survivors go on around a lost
rank (hierarchical_neighbor_allreduce's through commbench.faults.gossip_machines' step).
Each neighbor exchange (commbench.faults.gossip_exchange) waits through
commbench.faults.gossip_survival (one Work per peer, heartbeats in the store), and before
each evaluation the survivors gather in the store; they meet where a loss is found, then
- the job's process group is made again among the survivors alone, renumbered in rank
  order (rank 0 serves the store and never fails, so it stays rank 0): every collective
  the loop, the evaluation and the result take afterwards runs among them unchanged,
  since they all use the job's group and the job's one context (measured: destroying a
  gloo group with a killed or stopped peer and making the next one takes milliseconds);
- they mix along the survivors' schedule (commbench.topology.survivors), from the
  exchange the meeting settled.

A rank killed with a rejoin comes back between steps: every ADMIT_EVERY steps (only when
--fail holds a rejoin) the members gather and admit the ranks that asked
(commbench.faults.gossip_survival), make the group again in the order the job started
(rank 0 stays 0, a newcomer takes its place back), and the newcomer takes the survivors'
mean (commbench.faults.gossip_rejoin); they mix along the full schedule again once all
are back. What each failure cost: commbench.faults.gossip_costs."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple

from commbench.errors import UsageError
from commbench.faults import gossip_costs, gossip_rejoin
from commbench.faults.fail_schedule import schedule
from commbench.faults.gossip_survival import NEWS_EVERY, POLL_SECONDS, PREFIX, Meeting, Survival
from commbench.faults.recovery_hook import Progress, Recovery
from commbench.launch.detect import REJOINING

# Steps between the points where the members admit a rank that asked to come back.
ADMIT_EVERY = 5
# The job's context's values with one entry per rank: renumbered with the members.
PER_RANK = ("hostnames", "gpu_names", "cores", "physical_hosts", "machine_facts")


class Gossip(Recovery):
    """This rank's side of a gossip recovery: the loop's recovery hook (as
    commbench.faults.restart's Restart is) and the exchange's way through a loss."""

    def __init__(self, ctx, config):
        import torch.distributed as dist

        if ctx.backend != "gloo":  # every rank stops here alike
            raise UsageError("argument --recovery: gossip's survivors exchange over gloo, on "
                             "the CPU: pass --no-cuda")
        self.ctx, self.timeout = ctx, config.timeout
        self.samples_per_step = config.batch_size * config.per_sample
        self.coming_back = ctx.launch.launcher == REJOINING  # started again (gossip_launch)
        # the store the ranks met in, not the group's view of it (under the group's
        # prefix): a rank started again and `commbench gossip` reach it as it is
        self.store = gossip_rejoin.JOINING["store"] if self.coming_back else \
            dist.distributed_c10d._get_default_store().underlying_store
        self.me = ctx.rank  # this rank's number in the job as started: the store's keys
        self.started = ctx.world_size
        self.survivors: List[int] = list(range(ctx.world_size))
        self.fewest = ctx.world_size  # the fewest members the job had at once
        self.survival = Survival(self.store, ctx.rank, ctx.world_size, config.timeout)
        super().__init__()
        # the context as the job started: renumbering always starts from it
        self.as_started = {name: getattr(ctx, name) for name in (*PER_RANK, "machine_size")}
        self.rejoins = any(e.rejoin is not None for e in schedule(config.fail, self.started))
        if self.rejoins and self.me == 0:  # what a rank started again reads of the job
            self.store.set(f"{PREFIX}/job", gossip_rejoin.record(ctx, config))
        self.exchange, self.trained = None, (None, None)
        self.meetings: List[Dict[str, Any]] = []
        self.rejoined: Dict[int, List[Any]] = {}  # rank -> [admitted after step, when back]
        self.began = time.time()

    def begin(self, fails, model, optimizer, next_batch) -> Progress:
        """Beat from now on; a failing rank records when it fired, as it fires. A rank
        started again first comes back (`_come_back`)."""
        self.trained = (model, optimizer)
        self.survival.beat()
        self.store.set(f"{PREFIX}/pid/{self.me}", str(os.getpid()))
        fails.record = self._fired
        fails.survived = True
        if self.coming_back:
            self._come_back(fails, next_batch)
        return self.start

    def _come_back(self, fails, next_batch) -> None:
        """Ask the members to admit this rank, take the survivors' mean once they do, and
        resume where they stand: their next step, rank 0's clocks and curve, its event
        of --fail fired already, its data shard skipped to there (as Restart.begin)."""
        self.survival.ask()
        met, record = self.survival.admitted()
        self.join(met)
        self.exchange.step = met.resume_step
        fails.forget(list(fails.mine))
        fails.resume_at(met.resume_step, record["training_seconds"])
        for _ in range(met.resume_step):
            next_batch()
        self.start = Progress(met.resume_step, record["training_seconds"],
                              record["wall_seconds"], record["curve"])

    def machines(self) -> Tuple[int, int]:
        """(ranks per machine, machines) as the job started; the survivors' context may
        hold machines of unequal sizes."""
        size = self.as_started["machine_size"]
        return size, (self.started // size if size else len(set(self.as_started["hostnames"])))

    def _fired(self, event, steps: int) -> None:
        self.store.set(f"{PREFIX}/fired/{self.me}", json.dumps(
            {"event": str(event), "rank": self.me, "steps": steps, "at": time.time()}))

    def ranks(self, peers: Sequence[int]) -> List[int]:
        """The job's ranks as started of `peers` (ranks of the survivors' group)."""
        return [self.survivors[p] for p in peers]

    def lost(self, step: int, found: Sequence[int]) -> Meeting:
        """Announce the peers this rank found lost (as started), meet the survivors at
        exchange `step`, and make the job's process group again among them."""
        for peer in found:  # the first rank to find a peer lost says when
            if self.store.add(f"{PREFIX}/detected-count/{peer}", 1) == 1:
                self.store.set(f"{PREFIX}/detected/{peer}", repr(time.time()))
        self.survival.announce(found)
        met = self.survival.meet(step)
        self._regroup(met.survivors)
        known = {r for m in self.meetings for r in m["lost"]}
        self.meetings.append({"lost": [r for r in met.lost if r not in known],
                              "resume_step": met.resume_step,
                              "recovered_at": None})
        return met

    def gathered(self, step: int, why: str) -> Optional[Meeting]:
        """Wait in the store until every survivor is here (before the evaluation's
        collectives, which a lost rank would fail, or an admission); a loss announced
        meanwhile, or a silent survivor whose beat stood still for --timeout, is met
        first, having taken exchange `step`, and the fewer survivors gather again."""
        met = None
        while True:  # the key names the members: those who met elsewhere wait there
            key = f"{PREFIX}/gathered-{self.survival.generation}-{step}-{why}"
            self.store.add(key, 1)
            stopped: Tuple[int, ...] = ()
            while self.store.add(key, 0) < len(self.survivors) and not stopped:
                if self.survival.news():
                    break
                stopped = self.survival.stopped(set(self.survivors) - {self.me})
                time.sleep(POLL_SECONDS * NEWS_EVERY)
            else:
                if not stopped:
                    return met
            met = self.lost(step, stopped)

    def after_step(self, progress: Progress) -> None:
        """Every ADMIT_EVERY steps of a run whose --fail holds a rejoin: the members
        gather, and admit the ranks that asked to come back."""
        if not self.rejoins or progress.steps % ADMIT_EVERY:
            return
        self.exchange.gather("admission")
        saved = dataclasses.asdict(progress)  # the loop's Points made plain for the store
        joined = self.survival.decide(progress.steps, {
            name: saved[name] for name in ("training_seconds", "wall_seconds", "curve")})
        if joined:
            self.join(self.survival.admit(progress.steps, joined))

    def join(self, met: Meeting) -> None:
        """Every member and newcomer of an admission after step `met.resume_step`: the
        group made again, the newcomers given the survivors' mean, the schedule of the
        ranks still lost (the full one once all are back)."""
        self._regroup(met.survivors)
        model, optimizer = self.trained
        gossip_rejoin.hand_over(model, optimizer, self.me in met.joined,
                                len(met.survivors) - len(met.joined))
        self.exchange.mix_among(met)
        for rank in met.joined:
            self.rejoined[rank] = [met.resume_step, None]

    def _regroup(self, members) -> None:
        """The job's process group made again among `members` (as started, in order)."""
        import torch.distributed as dist

        self.survivors = list(members)
        self.fewest = min(self.fewest, len(members))
        rank = self.survivors.index(self.me)
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("gloo", store=dist.PrefixStore(
            f"{PREFIX}/group-{self.survival.generation}", self.store), rank=rank,
            world_size=len(self.survivors), timeout=timedelta(seconds=self.timeout))
        _renumber(self.ctx, self.as_started, self.survivors, rank)

    def exchanged(self) -> None:
        """An exchange among the members completed: the first after a meeting ends its
        recovery, the first after an admission the newcomers' rejoin."""
        now = time.time()
        if self.meetings and self.meetings[-1]["recovered_at"] is None:
            self.meetings[-1]["recovered_at"] = now
        for back in self.rejoined.values():
            back[1] = back[1] or now

    def facts(self, outcome: Dict[str, Any], model) -> Dict[str, Any]:
        """Rank 0, once training ended: what each failure cost, and the goodput."""
        wall = time.time() - self.began
        steps = outcome["steps"]
        costs = [gossip_costs.cost(self.store, r, next(m for m in self.meetings if r in
                                                       m["lost"]), self.rejoined.get(r),
                                   steps, self.samples_per_step)
                 for r in sorted({r for m in self.meetings for r in m["lost"]})]
        samples = steps * self.samples_per_step * self.started - self.samples_missed(steps)
        return {"policy": "gossip", "survivors": list(self.survivors),
                "rejoined": sorted(self.rejoined), "fewest_workers": self.fewest,
                "costs": [c for c in costs if c],
                "wall_seconds": wall, "goodput": samples / wall,
                "wall_time_to_target": wall if outcome.get("reached") else None}

    def samples_missed(self, steps: int) -> int:
        """Of `steps` steps of every worker that started, the samples of the steps the
        lost ranks did not take (commbench.faults.gossip_costs.missed)."""
        return gossip_costs.missed(self.store, self.meetings, self.rejoined,
                                   steps) * self.samples_per_step

    def lines(self, facts: Optional[Dict[str, Any]], rate: Optional[float],
              unit: str) -> List[str]:
        return gossip_costs.lines(facts, rate, unit)

    def leave(self) -> None:
        """After a loss, end this process without MPI's finalize, which would wait for
        the lost ranks; rank 0 first kills the stopped ones, which would keep the
        launcher waiting for ever. Rank 0 says the job ended: a newcomer still waiting
        to be admitted ends too."""
        if self.me == 0 and self.rejoins:
            self.store.set(f"{PREFIX}/ended", "1")
        if not self.meetings and not self.rejoined:
            return
        self.survival.part(len(self.survivors))
        if self.me == 0:
            for rank in self.survival.lost:
                try:
                    os.kill(int(self.store.get(f"{PREFIX}/pid/{rank}")), signal.SIGKILL)
                except (OSError, ValueError):
                    pass  # killed already, or on another machine: its launcher's
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _renumber(ctx, as_started: Dict[str, Any], members: List[int], rank: int) -> None:
    """The job's one context, seen by every component, made the members' job's: frozen
    for everyone else, it is changed here alone, where the job itself changed. Always
    from the context as the job started, whose ranks `members` name."""
    launch = dataclasses.replace(ctx.launch, rank=rank, world_size=len(members))
    keep = {name: tuple(as_started[name][r] for r in members) for name in PER_RANK
            if len(as_started[name]) > max(members)}
    size = as_started["machine_size"]
    size = size if size and len(members) % size == 0 else 0
    for name, value in {"launch": launch, "machine_size": size, **keep}.items():
        object.__setattr__(ctx, name, value)
