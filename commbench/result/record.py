"""What a run records: every rank's samples and spans gathered to rank 0, the step
split on rank 0's clock, the result file and then the timeline file. One `finish`
makes either kind of result, a speed run's (`Speed`) or a run trained to accuracy's
(`Trained`), and `write` writes it, once its summary has been printed."""

from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, List, NamedTuple, Optional, TypeVar, Union

from commbench.job import peak_flops, straggler
from commbench.result import metrics, store
from commbench.timing import failure_track, gpu_kernels, spans, trace_file, wire
from commbench.timing.clock_alignment import clock_offsets
from commbench.config.run_config import RunConfig
from commbench.errors import NotRecorded
from commbench.job.speed_loop import Timings
from commbench.job.per_iteration import diverged, flat_parameters, oversubscribed
from commbench.timing.step_split import Row, split_steps, summarize

T = TypeVar("T")
Clocks = Dict[str, List[float]]  # the result's clock_offsets: seconds, uncertainty
REFERENCE = ("reference_seconds", "reference_batch_seconds", "reference_windows",
             "reference_phase_seconds")


def written_by_rank_0(ctx, write: Callable[[], T]) -> Optional[T]:
    """Rank 0 writes (write()); every rank waits here until it has, and learns whether
    it could: a NotRecorded on rank 0 is raised on every rank (with rank 0's line there
    only), so that the whole job exits 1 together. What write() returned on rank 0, None
    elsewhere. A rank that left earlier would close its connections to the rendezvous
    store that rank 0 serves, and that server in torch 1.10 closes each such socket
    twice: the second close can take the descriptor of a file rank 0 has just opened,
    and its write fails."""
    import torch.distributed as dist

    written, failure = None, None
    if ctx.rank == 0:
        try:
            written = write()
        except NotRecorded as e:
            failure = str(e)
    if ctx.world_size > 1 and dist.is_initialized():
        told = [failure]
        dist.broadcast_object_list(told, src=0)
        failure = told[0]
    if failure is not None:
        raise NotRecorded(failure if ctx.rank == 0 else "")
    return written


class Unwritten(NamedTuple):
    """What rank 0 gathered, not yet written: the result and its file name's stem, and
    every rank's spans, host and clock offset for the timeline."""

    doc: Dict[str, Any]
    stem: str
    events: List[Any]
    hosts: List[str]
    clocks: Clocks


class Recorded(NamedTuple):
    """What rank 0 wrote: the result and its path, and why the timeline was not
    written (None when it was, or was not asked for)."""

    doc: Dict[str, Any]
    path: Path
    timeline_error: Optional[str]


def finish(config: RunConfig, ctx, strategy, measured: Union[Speed, Trained],
           machine: Optional[Dict[str, Any]], recorder: spans.Recorder,
           slowed: Optional[straggler.Straggler]) -> Optional[Unwritten]:
    """Every rank's samples (measured.mine()) and spans gathered to rank 0, which splits
    the steps and makes the result (measured.document()): what it will write (`write`)
    on rank 0, None elsewhere. measured: a Speed or a Trained; machine:
    environment.collect(), taken before the measurement; recorder: this rank's spans;
    slowed: this rank's straggler, None when it is not slowed."""
    import torch.distributed as dist

    offsets, offset_errors = clock_offsets(ctx)
    mine = {**measured.mine(), "spans": recorder.events, "hostname": socket.gethostname(),
            "slowdown": slowed.facts() if slowed is not None else None,
            "sent": recorder.sent.nbytes}
    everyone: List[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    if ctx.rank != 0:
        return None
    gathered = {key: [rank[key] for rank in everyone] for key in mine}
    events, hosts = gathered.pop("spans"), gathered.pop("hostname")
    slowdowns, sent = gathered.pop("slowdown"), gathered.pop("sent")
    clocks = {"seconds": offsets, "uncertainty": offset_errors}
    split = measured_split(strategy, ctx, events, offsets)
    doc = measured.document(config, ctx, strategy, gathered, split, clocks, machine)
    add_wire(doc, strategy, events, split, config.batch_size * config.per_sample)
    flag_unrecorded_wire(doc, strategy, sent)
    doc["summary"]["slow_ranks"] = straggler.summary(config.slow_ranks, slowdowns, events)
    stem = result_stem(config, ctx, strategy) + measured.stem_suffix
    return Unwritten(doc, stem, events, hosts, clocks)


@dataclass
class Speed:
    """A speed run's measurement: every rank's timings and final parameters, the
    compute-only reference (None without one), the consensus distances (rank 0's: the
    same everywhere) and what the run trained on."""

    timings: Timings
    reference: Any
    model: Any
    consensus: List[float]
    data_facts: Dict[str, Any]
    model_facts: Dict[str, Any] = field(default_factory=dict)  # a language model's
    recipe: Dict[str, Any] = field(default_factory=dict)  # a language model's AdamW
    stem_suffix: ClassVar[str] = ""

    def mine(self) -> Dict[str, Any]:
        timings, reference = self.timings, self.reference
        flat = flat_parameters(self.model).cpu().numpy()
        return {
            "iteration_seconds": timings.iteration_seconds,
            "batch_seconds": timings.batch_seconds,
            "loss": timings.loss,
            "reference_seconds": reference.timings.iteration_seconds if reference else None,
            "reference_batch_seconds": reference.timings.batch_seconds if reference else None,
            "reference_windows": reference.windows if reference else None,
            "reference_phase_seconds": reference.phase_seconds if reference else None,
            "parameter_digest": hashlib.sha256(flat.tobytes()).hexdigest()[:16],
            "first_non_finite_step": timings.first_non_finite_step,
        }

    def document(self, config: RunConfig, ctx, strategy, samples: Dict[str, Any], split,
                 clocks: Clocks, machine: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        samples["parameter_digests"] = samples.pop("parameter_digest")
        if self.reference is None:
            for key in REFERENCE:
                samples[key] = None
        samples["consensus_distance"] = self.consensus or None
        samples["step_split"] = split
        samples["clock_offsets"] = clocks
        doc = speed_document(config, ctx, strategy, samples, machine)
        summary = doc["summary"]
        summary.update(self.model_facts)
        if "flops_per_token" in summary:  # every rank's GPU: None on a CPU
            summary["mfu"] = peak_flops.mfu(summary["flops_per_token"],
                                            summary["img_sec_per_worker"]["mean"],
                                            (machine or {}).get("gpus") or [None])
        doc["data"] = self.data_facts
        if self.recipe:  # an image model's speed recipe is the benchmarks' (its flags)
            doc["recipe"] = self.recipe
        return doc


@dataclass
class Trained:
    """A run trained to accuracy: how it ended and its curve (training_to_accuracy.train's
    outcome), what it trained on and its recipe."""

    outcome: Dict[str, Any]
    data_facts: Dict[str, Any]
    recipe: Dict[str, Any]
    crowded: Optional[Dict[str, Any]] = None  # per_iteration.oversubscribed as it started
    stem_suffix: ClassVar[str] = "-accuracy"

    def mine(self) -> Dict[str, Any]:
        return {}

    def document(self, config: RunConfig, ctx, strategy, samples: Dict[str, Any], split,
                 clocks: Clocks, machine: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        outcome = dict(self.outcome)
        curve = outcome.pop("curve")
        doc = store.new_document("accuracy")
        doc.update(config=config.to_dict(), strategy=strategy_record(strategy),
                   environment=machine, data=self.data_facts, recipe=self.recipe,
                   curve=curve, clock_offsets=clocks,
                   summary={**outcome, "oversubscribed": self.crowded,
                            "step_split": summarize(split)})
        return doc


def add_wire(doc: Dict[str, Any], strategy, events, split: Optional[List[List[Row]]],
             images_per_step: int) -> None:
    """summary.wire: what each rank put on the wire per step (commbench.timing.wire), None where
    an engine communicates out of commbench's sight; a speed run's samples keep it per
    rank and step. A strategy that communicates in some steps only also gets the step
    split of those steps and of the others apart (`step_split_by_steps`)."""
    summary = doc["summary"]
    if not strategy.sees_wire:
        summary["wire"] = None
        return
    steps = sorted({span.step for mine in events for span in mine})
    sent = [wire.per_step(mine, steps) for mine in events]
    summary["wire"] = wire.summarize(sent, images_per_step)
    counted = type(strategy).counts_messages
    if not counted:
        summary["wire"]["messages_per_step"] = None
    if "samples" in doc:
        doc["samples"]["sent_bytes"] = [[s.nbytes for s in rank] for rank in sent]
        doc["samples"]["sent_messages"] = \
            [[s.messages for s in rank] for rank in sent] if counted else None
    if split and 0 < summary["wire"]["communicating_steps"] < 1 and \
            all(len(rows) == len(steps) for rows in split):
        summary["step_split_by_steps"] = {
            kind: summarize([[row for row, s in zip(rows, mine) if bool(s.nbytes) == busy]
                             for rows, mine in zip(split, sent)])
            for kind, busy in (("communicating", True), ("local", False))}


def flag_unrecorded_wire(doc: Dict[str, Any], strategy, sent: List[int]) -> None:
    """summary.wire_unrecorded, true (and only then present): a strategy that
    communicates recorded no bytes on the wire on any of its several ranks (sent: each
    rank's over the whole measurement). It moved them where commbench does not count (it
    called torch.distributed itself, or its pieces passed no sent=), and its bytes would
    read 0 where they are not."""
    if type(strategy).communicates and strategy.sees_wire and len(sent) > 1 and not any(sent):
        doc["summary"]["wire_unrecorded"] = True


def write(config: RunConfig, doc: Dict[str, Any], stem: str, events, hosts: List[str],
          clocks: Clocks) -> Recorded:
    """The result first: a timeline that cannot be written never costs a measurement."""
    path = store.write_result(config.results_dir, doc, stem)
    try:
        write_timeline(config, doc, events, hosts, clocks)
    except OSError as e:
        return Recorded(doc, path, f"{config.timeline}: {e.strerror or e}")
    return Recorded(doc, path, None)


def measured_split(strategy, ctx, events, offsets) -> Optional[List[List[Row]]]:
    """[rank][step] parts of each step (commbench.timing.step_split.PARTS), or None where the
    spans cannot tell: an engine that communicates inside its own step, or a GPU without
    its kernels' times (whose host clock sees when work was queued, not when it ran) or
    with kernels outside their steps."""
    if not type(strategy).records_split:
        return None
    if ctx.device.type == "cpu":
        return split_steps(events, offsets)
    if gpu_kernels.has_kernels(events) and all(gpu_kernels.aligned(mine) for mine in events):
        return split_steps([gpu_kernels.split_view(mine) for mine in events], offsets)
    return None


def write_timeline(config: RunConfig, doc: Dict[str, Any], events, hosts: List[str],
                   clocks: Clocks) -> None:
    """The --timeline file (when asked for): every rank's spans on rank 0's clock, and
    the failures of --fail that the result records the costs of."""
    if config.timeline is None:
        return
    names = [f"rank {r} ({host})" for r, host in enumerate(hosts)]
    offsets, recovery = clocks["seconds"], doc.get("recovery") or {}
    if "survivors" in recovery:  # gossip's, renumbered among themselves
        events, offsets, names = failure_track.as_started(recovery["survivors"], events,
                                                          offsets, hosts)
    # the failures' wall-clock times on rank 0's span clock (this is rank 0)
    failures = failure_track.from_costs(recovery.get("costs", ()), spans.now() - time.time())
    trace = trace_file.trace_events(events, offsets, names, config.timeline_steps, failures)
    trace_file.write_trace(config.timeline, trace,
                           {"commbench": doc["schema_version"], "config": doc["config"],
                            "clock_offsets": clocks})


def speed_document(config: RunConfig, ctx, strategy, samples,
                   machine: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    summary = metrics.summarize(config.batch_size * config.per_sample,
                                config.num_batches_per_iter,
                                samples["iteration_seconds"], samples["batch_seconds"],
                                samples["reference_seconds"], samples["reference_windows"])
    summary["unit"] = config.unit  # what the throughputs and bytes_per_image count
    summary["oversubscribed"] = oversubscribed(ctx)
    summary["parameters_identical"] = len(set(samples["parameter_digests"])) == 1
    summary["final_loss"] = sum(r[-1] for r in samples["loss"]) / ctx.world_size
    summary["final_consensus_distance"] = (samples["consensus_distance"] or [None])[-1]
    summary["diverged"] = diverged(samples["first_non_finite_step"])
    summary["step_split"] = summarize(samples["step_split"])
    doc = store.new_document("run")
    doc.update(config=config.to_dict(), strategy=strategy_record(strategy),
               environment=machine, samples=samples, summary=summary)
    return doc


def strategy_record(strategy) -> Dict[str, Any]:
    """The result's strategy: its name, whether it is decentralized, and its facts."""
    return {"name": type(strategy).name, "decentralized": type(strategy).decentralized,
            **strategy.facts()}


def result_stem(config: RunConfig, ctx, strategy) -> str:
    parts = [config.model, type(strategy).name]
    topology = strategy.facts().get("topology")
    if topology:
        parts.append(topology)
    return "-".join(parts + [f"n{ctx.world_size}"])
