"""What a run records: every rank's samples and spans gathered to rank 0, the step
split on rank 0's clock, the summary, the timeline file and the result file; the
result of a run trained to accuracy; and the consensus distance."""

from __future__ import annotations

import hashlib
import math
import socket
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional

from commbench import device_time, metrics, results, spans
from commbench.config import RunConfig
from commbench.loop import Timings, barrier


def wait_for_rank_0(ctx) -> None:
    """Every rank waits here until rank 0 has written its files. A rank that left
    earlier would close its connections to the rendezvous store that rank 0 serves, and
    that server in torch 1.10 closes each such socket twice: the second close can take
    the descriptor of a file rank 0 has just opened, and its write fails."""
    import torch.distributed as dist

    if ctx.world_size > 1 and dist.is_initialized():
        barrier()


def finish(config: RunConfig, ctx, strategy, timings: Timings, reference, model,
           consensus: List[float], data_facts: Dict[str, Any], machine: Optional[Dict[str, Any]]
           ) -> Optional["Recorded"]:
    """Every rank's samples and spans gathered to rank 0, which splits the steps and
    writes the result file, then the timeline: what it wrote on rank 0, None
    elsewhere. machine: environment.collect(), taken before the measurement."""
    offsets, offset_errors = spans.clock_offsets(ctx)
    samples = gather_samples(ctx, timings, reference, model, consensus)
    if ctx.rank != 0:
        return None
    events, hosts = samples.pop("spans"), samples.pop("hostname")
    samples["step_split"] = step_split(strategy, ctx, events, offsets)
    samples["clock_offsets"] = {"seconds": offsets, "uncertainty": offset_errors}
    doc = result_document(config, ctx, strategy, samples, machine)
    doc["data"] = data_facts
    return write(config, doc, result_stem(config, ctx, strategy), events, hosts,
                 samples["clock_offsets"])


def finish_training(config: RunConfig, ctx, strategy, outcome: Dict[str, Any],
                    data_facts: Dict[str, Any], recipe: Dict[str, Any],
                    machine: Optional[Dict[str, Any]]) -> Optional["Recorded"]:
    """The result of a run trained to accuracy, written by rank 0 with the split of the
    steps whose spans were kept, then the timeline: what it wrote on rank 0, None
    elsewhere."""
    import torch.distributed as dist

    offsets, offset_errors = spans.clock_offsets(ctx)
    everyone: List[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, (spans.RECORDER.events, socket.gethostname()))
    if ctx.rank != 0:
        return None
    events, hosts = [e for e, _ in everyone], [h for _, h in everyone]
    curve = outcome.pop("curve")
    clocks = {"seconds": offsets, "uncertainty": offset_errors}
    doc = results.new_document("accuracy")
    doc.update(config=config.to_dict(),
               strategy={"name": type(strategy).name,
                         "decentralized": type(strategy).decentralized, **strategy.facts()},
               environment=machine, data=data_facts, recipe=recipe,
               curve=curve, clock_offsets=clocks,
               summary={**outcome, "oversubscribed": oversubscribed(ctx),
                        "step_split": spans.summarize(step_split(strategy, ctx, events,
                                                                 offsets))})
    stem = result_stem(config, ctx, strategy) + "-accuracy"
    return write(config, doc, stem, events, hosts, clocks)


class Recorded(NamedTuple):
    """What rank 0 wrote: the result and its path, and why the timeline was not
    written (None when it was, or was not asked for)."""

    doc: Dict[str, Any]
    path: Path
    timeline_error: Optional[str]


def write(config: RunConfig, doc: Dict[str, Any], stem: str, events, hosts: List[str],
          clocks: Dict[str, List[float]]) -> Recorded:
    """The result first: a timeline that cannot be written never costs a measurement."""
    path = results.write_result(config.results_dir, doc, stem)
    try:
        write_timeline(config, doc, events, hosts, clocks)
    except OSError as e:
        return Recorded(doc, path, f"{config.timeline}: {e.strerror or e}")
    return Recorded(doc, path, None)


def step_split(strategy, ctx, events, offsets) -> Optional[List[List[List[float]]]]:
    """[rank][step] parts of each step (commbench.spans.PARTS), or None where the spans
    cannot tell: an engine that communicates inside its own step, or a GPU without its
    kernels' times (whose host clock sees when work was queued, not when it ran) or
    with kernels outside their steps."""
    if not type(strategy).records_split:
        return None
    if ctx.device.type == "cpu":
        return spans.split_steps(events, offsets)
    if device_time.has_kernels(events) and all(device_time.aligned(mine) for mine in events):
        return spans.split_steps([device_time.split_view(mine) for mine in events], offsets)
    return None


def write_timeline(config: RunConfig, doc: Dict[str, Any], events, hosts: List[str],
                   clocks: Dict[str, List[float]]) -> None:
    """The --timeline file (when asked for): every rank's spans on rank 0's clock."""
    if config.timeline is None:
        return
    names = [f"rank {r} ({host})" for r, host in enumerate(hosts)]
    spans.write_trace(config.timeline,
                      spans.trace_events(events, clocks["seconds"], names, config.timeline_steps),
                      {"commbench": doc["schema_version"], "config": doc["config"],
                       "clock_offsets": clocks})


def consensus_distance(model, world_size: int) -> float:
    """Mean over workers of ||x_r - mean x||^2 / ||mean x||^2 (see commbench.metrics)."""
    import torch
    import torch.distributed as dist

    x = flat_parameters(model)
    mean = x.clone()  # summed in the parameters' own precision: half the bytes of float64
    dist.all_reduce(mean)
    mean /= world_size
    x, mean = x.double(), mean.double()
    gap = torch.stack([(x - mean).pow(2).sum(), mean.pow(2).sum()])
    dist.all_reduce(gap)  # the second entry is world_size * ||mean||^2
    if not bool(torch.isfinite(gap).all()):
        return math.nan  # a diverged model: no distance to speak of
    return float(gap[0] / gap[1]) if gap[1] > 0 else 0.0


def flat_parameters(model):
    import torch

    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gather_samples(ctx, timings: Timings, reference, model, consensus) -> Dict[str, Any]:
    import torch.distributed as dist

    flat = flat_parameters(model).cpu().numpy()
    mine = {
        "iteration_seconds": timings.iteration_seconds,
        "batch_seconds": timings.batch_seconds,
        "loss": timings.loss,
        "reference_seconds": reference.timings.iteration_seconds if reference else None,
        "reference_batch_seconds": reference.timings.batch_seconds if reference else None,
        "reference_windows": reference.windows if reference else None,
        "reference_phase_seconds": reference.phase_seconds if reference else None,
        "parameter_digest": hashlib.sha256(flat.tobytes()).hexdigest()[:16],
        "first_non_finite_step": timings.first_non_finite_step,
        "spans": spans.RECORDER.events,
        "hostname": socket.gethostname(),
    }
    everyone: List[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    samples = {key: [rank[key] for rank in everyone] for key in mine}
    samples["parameter_digests"] = samples.pop("parameter_digest")
    if reference is None:
        for key in ("reference_seconds", "reference_batch_seconds", "reference_windows",
                    "reference_phase_seconds"):
            samples[key] = None
    samples["consensus_distance"] = consensus or None
    return samples


def result_document(config: RunConfig, ctx, strategy, samples,
                    machine: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    summary = metrics.summarize(config.batch_size, config.num_batches_per_iter,
                                samples["iteration_seconds"], samples["batch_seconds"],
                                samples["reference_seconds"], samples["reference_windows"])
    summary["oversubscribed"] = oversubscribed(ctx)
    summary["parameters_identical"] = len(set(samples["parameter_digests"])) == 1
    summary["final_loss"] = sum(r[-1] for r in samples["loss"]) / ctx.world_size
    summary["final_consensus_distance"] = (samples["consensus_distance"] or [None])[-1]
    summary["diverged"] = diverged(samples["first_non_finite_step"])
    summary["step_split"] = spans.summarize(samples["step_split"])
    doc = results.new_document("run")
    doc.update(config=config.to_dict(),
               strategy={"name": type(strategy).name,
                         "decentralized": type(strategy).decentralized, **strategy.facts()},
               environment=machine, samples=samples, summary=summary)
    return doc


def diverged(first_non_finite: List[Optional[int]]) -> Optional[Dict[str, int]]:
    """Where the run diverged: the first step whose loss was not finite on any rank,
    and the lowest rank that saw it then; None when every loss was finite."""
    seen = [(step, rank) for rank, step in enumerate(first_non_finite) if step is not None]
    if not seen:
        return None
    step, rank = min(seen)
    return {"step": step, "rank": rank}


def oversubscribed(ctx) -> Optional[Dict[str, Any]]:
    """The most loaded machine when CPU workers outnumber its physical cores (each
    worker then shares cores and the run measures CPU sharing, not communication)."""
    if ctx.device.type != "cpu":
        return None  # more ranks than GPUs on a machine is refused at start-up
    host, workers, cores = max(ctx.machine_load(), key=lambda m: m[1] / m[2])
    return {"machine": host, "workers": workers, "physical_cores": cores} \
        if workers > cores else None


def result_stem(config: RunConfig, ctx, strategy) -> str:
    parts = [config.model, type(strategy).name]
    topology = strategy.facts().get("topology")
    if topology:
        parts.append(topology)
    return "-".join(parts + [f"n{ctx.world_size}"])
