"""A run trained to accuracy under `--recovery restart` (commbench.faults.recovery): where it
resumes, the checkpoints it takes, and what each failure cost.

Beside the checkpoints, the job's directory holds small records, each written
atomically, that outlive the processes a failure ends:
- `starts.record`: when each attempt of the job started (rank 0);
- `fired-I.record`: event I of the --fail schedule fired: its rank, the steps it had
  completed, when, the bytes it had put on the wire since the job first started
  (written by the failing rank before it dies, so that no attempt fires it again);
- `noticed-R.record`: when rank R found something broken and ended the job (a peer's
  connection gone, or --timeout spent waiting for it), each time it did;
- `recovered-I.record`: the attempt that recovered from it: when the launcher started
  the job again, the step it resumed from, when its first complete step ended (rank 0).
A failure was detected when the first survivor noticed it or, where none did before the
launcher ended them, when the launcher started the job again.
Records are not .json: `report` reads every .json under --results-dir."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from commbench.faults import checkpoint, fail_schedule, recovery
from commbench.faults.recovery_hook import Progress, Recovery, goodput_line
from commbench.job import failure

RECORD = ".record"


def read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write(path: Path, value: Any) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def started_at() -> float:
    """When this process started, on the wall clock: under torchrun, when its elastic
    agent started the workers again (Linux's /proc, to its clock tick; now elsewhere)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class Restart(Recovery):
    """This attempt of a restarting job, on every rank."""

    def __init__(self, config, ctx, say: Callable[[str], None]) -> None:
        super().__init__()
        self.dir = recovery.job_dir(config, ctx.world_size)
        self.every, self.rank, self.say = config.checkpoint_every, ctx.rank, say
        # goodput's unit is the run's: images, or a language model's tokens
        self.samples_per_step = config.batch_size * config.per_sample * ctx.world_size
        self.events = list(fail_schedule.schedule(config.fail, ctx.world_size))
        self.trained: Tuple[Any, Any] = (None, None)  # the model and optimizer checkpointed
        self.progress = Progress()  # where this attempt stands, after its last step
        self.pending: List[int] = []  # the fired events this attempt recovers from
        self.detected = float(os.environ.get(recovery.DETECTED) or started_at())
        self.failing = False  # this rank fired an event: its notices are not a survivor's
        self.noting = threading.Lock()  # the --timeout guard's thread notices too
        failure.on_failure = self.noticed

    def fired(self, event: fail_schedule.FailEvent, steps: int) -> None:
        """The failing rank, before it dies: event fired after `steps` complete steps."""
        index, self.failing = self.events.index(event), True
        write(self.dir / f"fired-{index}{RECORD}", {
            "event": str(event), "rank": event.rank, "steps": steps, "at": time.time(),
            "bytes_sent": self.progress.bytes_sent})

    def noticed(self) -> None:
        """This rank, as it ends the job on finding something broken. Not the failing
        rank: on a cut machine, a write to a shared directory could hang its exit."""
        if self.failing:
            return
        path = self.dir / f"noticed-{self.rank}{RECORD}"
        with self.noting:
            write(path, (read(path) or []) + [time.time()])

    def begin(self, fails, model, optimizer, skip: Callable[[], Any]) -> Progress:
        """Every rank: the newest complete checkpoint of this job loaded (rank 0 chooses),
        the fired events forgotten, a rejoin's delay waited out, the data skipped to
        where training stood (skip() draws one batch). Where training resumes; its bytes
        on the wire, the earlier attempts' (as the last failing rank counted them)."""
        import torch.distributed as dist

        self.trained = (model, optimizer)
        plan = [self._plan() if self.rank == 0 else None]
        dist.broadcast_object_list(plan, src=0)
        found, fired, self.pending, wait, sent = plan[0]
        self.start = Progress(bytes_sent=sent)
        fails.forget([self.events[i] for i in fired])
        fails.record = self.fired
        if wait > 0:
            self.say(f"Waiting {wait:.1f} s before the job rejoins (--fail's +REJOIN)")
            time.sleep(wait)
        if found is None:
            self.say(f"No checkpoint of this job in {self.dir}: training starts from step 0")
            return self.start
        where = checkpoint.load(Path(found), model, optimizer, self.rank)
        self.start = Progress(**{**where, "bytes_sent": sent})
        for _ in range(self.start.steps):
            skip()
        fails.resume_at(self.start.steps, self.start.training_seconds)
        self.say(f"Resumed from checkpoint {found} (step {self.start.steps})")
        return self.start

    def _plan(self):
        """Rank 0: (checkpoint or None, fired events, those not yet recovered from,
        seconds left to wait for a rejoin, bytes each rank sent in the earlier attempts)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        starts = read(self.dir / f"starts{RECORD}") or []
        write(self.dir / f"starts{RECORD}", starts + [self.detected])
        newest = checkpoint.newest_readable(self.dir, self.say)
        fired = {i: read(self.dir / f"fired-{i}{RECORD}") for i in range(len(self.events))}
        fired = {i: r for i, r in fired.items() if r is not None}
        pending = [i for i in fired if not (self.dir / f"recovered-{i}{RECORD}").exists()]
        rejoins = [fired[i]["at"] + self.events[i].rejoin for i in pending
                   if self.events[i].rejoin is not None]
        wait = max(rejoins, default=0.0) - time.time()
        sent = max((r.get("bytes_sent", 0) for r in fired.values()), default=0)
        return (None if newest is None else str(newest[1]), sorted(fired), pending, wait, sent)

    def after_step(self, progress: Progress) -> None:
        """Every rank, after each step (and its evaluation): the first complete step
        after a failure recorded, and a checkpoint every --checkpoint-every steps."""
        self.progress = progress
        if self.rank == 0 and self.pending and progress.steps == self.start.steps + 1:
            now = time.time()
            for index in self.pending:
                write(self.dir / f"recovered-{index}{RECORD}", {
                    "detected": self.detected, "resumed_from": self.start.steps,
                    "recovered": now})
        if progress.steps % self.every == 0:
            checkpoint.save(self.dir, progress.steps, *self.trained, self.rank,
                            asdict(progress))

    def facts(self, outcome: Dict[str, Any], model) -> Dict[str, Any]:
        """Rank 0, once training ended: what the failures cost, and the job's goodput
        from its first start; the job's directory is then retired, so that the same
        command run again starts afresh."""
        starts = read(self.dir / f"starts{RECORD}") or [self.detected]
        wall = time.time() - starts[0]
        costs = [self._cost(i) for i in range(len(self.events))]
        facts = {
            "policy": "restart", "checkpoint_every": self.every,
            "restarts": len(starts) - 1, "costs": [c for c in costs if c is not None],
            "wall_seconds": wall,
            "goodput": outcome["steps"] * self.samples_per_step / wall,
            "wall_time_to_target": wall if outcome.get("reached") else None,
            "final_model_sha256": checkpoint.digest(model)}
        self.dir.rename(self.dir.with_name(f"{self.dir.name}.finished-{time.time():.0f}"))
        return facts

    def _cost(self, index: int) -> Optional[Dict[str, Any]]:
        fired = read(self.dir / f"fired-{index}{RECORD}")
        recovered = read(self.dir / f"recovered-{index}{RECORD}")
        if fired is None or recovered is None:
            return None
        lost = max(0, fired["steps"] - recovered["resumed_from"])
        # the first start after the failure: an attempt that failed before its first
        # step recovers from two events, and started after both
        starts = read(self.dir / f"starts{RECORD}") or []
        restarted = min((t for t in starts if t > fired["at"]), default=recovered["detected"])
        noticed = [t for path in self.dir.glob(f"noticed-*{RECORD}")
                   if path.name != f"noticed-{fired['rank']}{RECORD}"  # survivors only
                   for t in read(path) or [] if fired["at"] <= t <= restarted]
        return {"event": fired["event"], "rank": fired["rank"],
                "failed_after_step": fired["steps"], "failed_at": fired["at"],
                "detection_seconds": min(noticed, default=restarted) - fired["at"],
                "restart_seconds": restarted - fired["at"],
                "recovery_seconds": recovered["recovered"] - fired["at"],
                "resumed_from_step": recovered["resumed_from"],
                "steps_lost": lost, "samples_lost": lost * self.samples_per_step}

    def lines(self, facts: Optional[Dict[str, Any]], rate: Optional[float],
              unit: str) -> List[str]:
        return cost_lines(facts, rate, unit)


def cost_lines(facts: Dict[str, Any], rate: Optional[float], unit: str) -> List[str]:
    """What rank 0 prints of it, after the outcome."""
    said = [f"Failure {c['event']}: detected after {c['detection_seconds']:.1f} s, "
            f"{_restarted(c)}first complete step {c['recovery_seconds']:.1f} s after it; "
            f"resumed from step {c['resumed_from_step']}, {c['steps_lost']} steps "
            f"({c['samples_lost']} {unit}) redone" for c in facts["costs"]]
    restarts = f"{facts['restarts']} restart{'s' if facts['restarts'] != 1 else ''}"
    return said + [goodput_line(facts, rate, unit, f" from the first start, {restarts} "
                                "included")]


def _restarted(cost: Dict[str, Any]) -> str:
    """When the launcher started the job again, where that was later than the detection
    (a cut machine's daemon, given up by mpirun only after its keepalive)."""
    restart = cost.get("restart_seconds")
    return ("" if restart is None or restart - cost["detection_seconds"] < 0.05 else
            f"its launcher ended it after {restart:.1f} s, ")
