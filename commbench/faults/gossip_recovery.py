"""`--recovery gossip` (issue 56): neighbor_allreduce's survivors go on around a lost
rank. Each neighbor exchange (commbench.faults.gossip_exchange) waits through
commbench.faults.gossip_survival (one Work per peer, heartbeats in the store), and before
each evaluation the survivors gather in the store; they meet where a loss is found, then
- the job's process group is made again among the survivors alone, renumbered in rank
  order (rank 0 serves the store and never fails, so it stays rank 0): every collective
  the loop, the evaluation and the result take afterwards runs among them unchanged,
  since they all use the job's group and the job's one context (measured: destroying a
  gloo group with a killed or stopped peer and making the next one takes milliseconds);
- they mix along the survivors' schedule (commbench.topology.survivors), from the
  exchange the meeting settled.

What a failure cost, in the shape of the restart and torchft costs: detection, from the
failure to the first survivor that found it; recovery, to the end of rank 0's first
exchange among the survivors; the steps the run then took with fewer workers and the
samples the lost ones did not learn from in them."""

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
from commbench.faults.gossip_survival import NEWS_EVERY, POLL_SECONDS, PREFIX, Meeting, Survival
from commbench.faults.recovery_hook import Recovery, goodput_line


class Gossip(Recovery):
    """This rank's side of a gossip recovery: the loop's recovery hook (as
    commbench.faults.restart's Restart is) and the exchange's way through a loss."""

    def __init__(self, ctx, timeout: float, samples_per_step: int):
        import torch.distributed as dist

        if ctx.backend != "gloo":  # every rank stops here alike
            raise UsageError("argument --recovery: gossip's survivors exchange over gloo, on "
                             "the CPU: pass --no-cuda")
        self.ctx, self.timeout, self.samples_per_step = ctx, timeout, samples_per_step
        self.store = dist.distributed_c10d._get_default_store()
        self.me = ctx.rank  # this rank's number in the job as started: the store's keys
        self.started = ctx.world_size
        self.survivors: List[int] = list(range(ctx.world_size))
        self.survival = Survival(self.store, ctx.rank, ctx.world_size, timeout)
        super().__init__()
        self.meetings: List[Dict[str, Any]] = []
        self.began = time.time()
        self.barriers = 0

    def begin(self, fails, model, optimizer, next_batch) -> None:
        """Beat from now on; a failing rank records when it fired, as it fires."""
        self.survival.beat()
        self.store.set(f"{PREFIX}/pid/{self.me}", str(os.getpid()))
        fails.record = self._fired
        fails.survived = True

    def _fired(self, event, steps: int) -> None:
        self.store.set(f"{PREFIX}/fired/{self.me}", json.dumps(
            {"event": str(event), "rank": self.me, "steps": steps, "at": time.time()}))

    def ranks(self, peers: Sequence[int]) -> List[int]:
        """The job's ranks as started of `peers` (ranks of the survivors' group)."""
        return [self.survivors[p] for p in peers]

    def lost(self, step: int, found: Sequence[int]) -> Meeting:
        """Announce the peers this rank found lost (as started), meet the survivors at
        exchange `step`, and make the job's process group again among them."""
        import torch.distributed as dist

        for peer in found:  # the first rank to find a peer lost says when
            if self.store.add(f"{PREFIX}/detected-count/{peer}", 1) == 1:
                self.store.set(f"{PREFIX}/detected/{peer}", repr(time.time()))
        self.survival.announce(found)
        met = self.survival.meet(step)
        self.survivors = list(met.survivors)
        rank = self.survivors.index(self.me)
        dist.destroy_process_group()
        dist.init_process_group("gloo", store=dist.PrefixStore(
            f"{PREFIX}/group-{len(met.lost)}", self.store), rank=rank,
            world_size=len(self.survivors), timeout=timedelta(seconds=self.timeout))
        _renumber(self.ctx, self.survivors, rank)
        known = {r for m in self.meetings for r in m["lost"]}
        self.meetings.append({"lost": [r for r in met.lost if r not in known],
                              "resume_step": met.resume_step,
                              "recovered_at": None})
        return met

    def gathered(self, step: int) -> Optional[Meeting]:
        """Wait in the store until every survivor is here (before the evaluation's
        collectives, which a lost rank would fail); a loss announced meanwhile, or a
        silent survivor whose beat stood still for --timeout, is met first, having
        taken exchange `step`, and the fewer survivors gather again."""
        self.barriers += 1
        met = None
        while True:  # the key names the survivors: those who met elsewhere wait there
            key = f"{PREFIX}/gathered-{len(self.survival.lost)}-{self.barriers}"
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

    def exchanged(self) -> None:
        """An exchange among the survivors completed: the first after a meeting ends
        its recovery."""
        if self.meetings and self.meetings[-1]["recovered_at"] is None:
            self.meetings[-1]["recovered_at"] = time.time()

    def facts(self, outcome: Dict[str, Any], model) -> Dict[str, Any]:
        """Rank 0, once training ended: what each failure cost, and the goodput."""
        wall = time.time() - self.began
        costs = [c for c in (self._cost(r, outcome["steps"]) for r in
                             sorted({r for m in self.meetings for r in m["lost"]})) if c]
        samples = outcome["steps"] * self.samples_per_step * self.started - \
            self.samples_missed(outcome["steps"])
        return {"policy": "gossip", "survivors": list(self.survivors),
                "costs": costs, "wall_seconds": wall, "goodput": samples / wall,
                "wall_time_to_target": wall if outcome.get("reached") else None}

    def samples_missed(self, steps: int) -> int:
        """Of `steps` steps of every worker that started, the samples of the steps the
        lost ranks did not take: after the step each fired at (its record), or, found
        silent without --fail, the exchange the survivors resumed at."""
        missed = 0
        for meeting in self.meetings:
            for rank in meeting["lost"]:
                key = f"{PREFIX}/fired/{rank}"
                last = json.loads(self.store.get(key))["steps"] if self.store.check([key]) \
                    else meeting["resume_step"] - 1
                missed += max(0, steps - last)
        return missed * self.samples_per_step

    def _cost(self, rank: int, steps: int) -> Optional[Dict[str, Any]]:
        key = f"{PREFIX}/fired/{rank}"
        if not self.store.check([key]):  # lost without --fail: silent too long
            return None
        fired = json.loads(self.store.get(key))
        at = fired["at"]
        meeting = next(m for m in self.meetings if rank in m["lost"])
        detected = float(self.store.get(f"{PREFIX}/detected/{rank}"))
        fewer = max(0, steps - fired["steps"])
        recovered = meeting["recovered_at"]
        return {"event": fired["event"], "rank": rank, "failed_after_step": fired["steps"],
                "failed_at": at, "detection_seconds": detected - at,
                "recovery_seconds": None if recovered is None else recovered - at,
                "rejoin_seconds": None, "resumed_at_exchange": meeting["resume_step"],
                "steps_with_fewer_workers": fewer,
                "samples_lost": fewer * self.samples_per_step}

    def lines(self, facts: Optional[Dict[str, Any]], rate: Optional[float],
              unit: str) -> List[str]:
        return lines(facts, rate, unit)

    def leave(self) -> None:
        """After a loss, end this process without MPI's finalize, which would wait for
        the lost ranks; rank 0 first kills the stopped ones, which would keep the
        launcher waiting for ever."""
        if not self.meetings:
            return
        if self.me == 0:
            for rank in self.survival.lost:
                try:
                    os.kill(int(self.store.get(f"{PREFIX}/pid/{rank}")), signal.SIGKILL)
                except (OSError, ValueError):
                    pass  # killed already, or on another machine: its launcher's
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _renumber(ctx, survivors: List[int], rank: int) -> None:
    """The job's one context, seen by every component, made the survivors' job's: frozen
    for everyone else, it is changed here alone, where the job itself changed."""
    launch = dataclasses.replace(ctx.launch, rank=rank, world_size=len(survivors))
    keep = {name: tuple(getattr(ctx, name)[r] for r in survivors) for name in (
        "hostnames", "gpu_names", "cores", "physical_hosts", "machine_facts")
        if len(getattr(ctx, name)) > max(survivors)}
    size = ctx.machine_size if ctx.machine_size and len(survivors) % ctx.machine_size == 0 \
        else 0
    for name, value in {"launch": launch, "machine_size": size, **keep}.items():
        object.__setattr__(ctx, name, value)


def lines(facts: Dict[str, Any], rate: Optional[float], unit: str) -> List[str]:
    """What rank 0 prints of the failures and the goodput, after the outcome."""
    said = []
    for c in facts["costs"]:
        recovered = ("not seen" if c["recovery_seconds"] is None
                     else f"{c['recovery_seconds']:.1f} s after it")
        said.append(f"Failure {c['event']}: detected after {c['detection_seconds']:.1f} s, "
                    f"first exchange among the survivors {recovered}; "
                    f"{c['steps_with_fewer_workers']} steps with fewer workers "
                    f"({c['samples_lost']} {unit} not learnt from)")
    return said + [goodput_line(facts, rate, unit, f", {_survivors(facts)}, failures "
                                "included")]


def _survivors(facts: Dict[str, Any]) -> str:
    count = len(facts.get("survivors", ()))
    return f"{count} survivor{'' if count == 1 else 's'}"
