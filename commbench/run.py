"""`commbench run` (the default subcommand): one benchmark job on every rank.

Flags -> RunConfig -> who am I -> process group -> plugin wraps model and
optimizer -> compute-only reference -> warm-up and timed iterations -> samples of
every rank gathered to rank 0 -> summary -> one result file written by rank 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from typing import Any, Dict, List, Optional

from commbench import environment, metrics, precision, registry, results, spans
from commbench.allocator import steady_malloc
from commbench.config import RunConfig, add_run_arguments, config_from_args
from commbench.data import batches, partition
from commbench.errors import UsageError
from commbench.launch.detect import LaunchInfo, detect_launch
from commbench.loop import Timings, device_sync, measure, warm_up
from commbench.reference import ComputeOnly
from commbench.models import build_model, model_names


def add_arguments(parser) -> None:
    add_run_arguments(parser)


def main(args) -> int:
    run(config_from_args(args))
    return 0


def run(config: RunConfig) -> Dict[str, Any]:
    steady_malloc()  # first: every measurement of the job in one allocation regime
    launch = detect_launch()
    strategy_cls = validate(config, launch)
    results.ensure_writable(config.results_dir)

    import torch

    from commbench.launch.distributed import init_distributed

    ctx = init_distributed(launch, config.no_cuda, config.timeout, config.machine_size)
    say = Printer(ctx.rank == 0)
    _check_same_config(ctx, config)
    precision.check(config.amp, ctx.device.type)
    if ctx.device.type == "cuda":
        # As Horovod's synthetic benchmark does: cuDNN picks its fastest kernels for
        # these fixed shapes during warm-up (recorded in the result's environment).
        torch.backends.cudnn.benchmark = True
    strategy = strategy_cls(ctx, config)

    data = _batches(config, ctx)
    torch.manual_seed(config.seed + (ctx.rank if config.independent_init else 0))
    model = build_model(config.model, data.classes).to(ctx.device)
    images, labels = data.next()
    _check_image_size(model, images, config)
    sync = device_sync(ctx.device)
    _print_header(say, config, ctx, strategy)
    if "class_mix" in data.facts:
        say(f"Data: {data.facts['data']}, {data.facts['steps_per_epoch']} steps per epoch; "
            f"partition {config.partition}: {partition.describe(data.facts['class_mix'])}")

    reference = None
    if config.reference_iters and strategy_cls.name != "none":
        say("Measuring the compute-only reference...")
        reference = ComputeOnly(lambda twin: _trainable(twin, config, ctx.device), model,
                                config, images, labels, sync)
        reference.half()

    step = strategy.wrap(*_trainable(model, config, ctx.device))
    progress = IterationReport(ctx, config, model, strategy_cls.decentralized, say)
    say("Running warmup...")
    warm_up(lambda: step(*data.next()), sync, config.num_warmup_batches)
    say("Running benchmark...")
    spans.RECORDER.reset()
    timings = measure(lambda: step(*data.next()), sync, config.num_iters,
                      config.num_batches_per_iter, after_iteration=progress,
                      recorder=spans.RECORDER)
    if reference is not None:
        say("Measuring the compute-only reference again...")
        reference.half()

    offsets, offset_errors = spans.clock_offsets(ctx)
    samples = _gather_samples(ctx, timings, reference, model, progress.consensus)
    if ctx.rank != 0:
        return {}
    events, hosts = samples.pop("spans"), samples.pop("hostname")
    samples["step_split"] = spans.split_steps(events, offsets) if strategy_cls.records_split \
        else None
    samples["clock_offsets"] = {"seconds": offsets, "uncertainty": offset_errors}
    doc = _result_document(config, ctx, strategy, samples)
    doc["data"] = data.facts
    if config.timeline is not None:
        names = [f"rank {r} ({host})" for r, host in enumerate(hosts)]
        spans.write_trace(config.timeline,
                          spans.trace_events(events, offsets, names, config.timeline_steps),
                          {"commbench": doc["schema_version"], "config": doc["config"],
                           "clock_offsets": samples["clock_offsets"]})
    path = results.write_result(config.results_dir, doc, _result_stem(config, ctx, strategy))
    _print_summary(say, doc["summary"], ctx)
    if config.timeline is not None:
        steps = len(timings.batch_seconds) * config.num_batches_per_iter
        window = "" if steps <= config.timeline_steps else \
            f" (the last {config.timeline_steps} of {steps} steps: --timeline-steps)"
        say(f"Timeline: {config.timeline}{window}")
        if doc["strategy"].get("engine_timeline"):
            say(f"The engine's own timeline: {doc['strategy']['engine_timeline']}")
    say(f"Result: {path}")
    return doc


def _batches(config: RunConfig, ctx) -> batches.Batches:
    task = batches.parse(config.data, config.seed)
    if task is None:
        return batches.synthetic(config.batch_size, config.image_size, config.num_classes,
                                 ctx.device, seed=config.seed + 7919 * (ctx.rank + 1))
    return batches.learnable(task, config.partition, config.batch_size, config.image_size,
                             ctx.rank, ctx.world_size, ctx.device, config.seed)


def validate(config: RunConfig, launch: LaunchInfo):
    """Everything that can be wrong with the request, checked before any communication
    so that all ranks fail alike instead of waiting on each other. Returns the plugin."""
    strategy_cls = registry.resolve(config.dist_optimizer)
    why_not = registry.usable_reason(strategy_cls)
    if why_not:
        raise UsageError(f"argument --dist-optimizer: {strategy_cls.name} cannot run here: "
                         f"{why_not}")
    strategy_cls.check(config, launch)
    batches.parse(config.data, config.seed)
    partition.parse(config.partition)
    if config.timeline is not None:
        try:
            spans.check_writable(config.timeline)
        except OSError as e:
            raise UsageError(f"argument --timeline: {e}") from None
        if os.path.exists(config.timeline):
            raise UsageError(f"argument --timeline: {config.timeline} exists; commbench "
                             "never overwrites a measurement")
    if config.model not in model_names():
        build_model(config.model, config.num_classes)  # raises the UsageError
    return strategy_cls


class Printer:
    """Only rank 0 prints, flushed, so output from many ranks never interleaves."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)


def _check_same_config(ctx, config: RunConfig) -> None:
    """Ranks started with different flags or commbench versions would measure nonsense."""
    import torch.distributed as dist

    from commbench import __version__

    # Only rank 0 writes results, so where the others would have written them is moot.
    flags = {k: v for k, v in config.to_dict().items() if k != "results_dir"}
    mine = json.dumps([__version__, flags], sort_keys=True)
    digest = hashlib.sha256(mine.encode()).hexdigest()
    everyone: List[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, (digest, mine))
    odd = [r for r, (d, _) in enumerate(everyone) if d != everyone[0][0]]
    if odd:
        theirs = json.loads(everyone[odd[0]][1])
        ours = json.loads(everyone[0][1])
        keys = [k for k in ours[1] if ours[1][k] != theirs[1].get(k)]
        what = (f"flags differ ({', '.join('--' + k.replace('_', '-') for k in keys)})"
                if keys else f"commbench versions differ ({ours[0]} vs {theirs[0]})")
        raise UsageError(f"ranks were started with different configurations: rank "
                         f"{odd[0]} and rank 0 {what}")


# What torch says when a layer's input is smaller than its kernel or pooling window.
TOO_SMALL = re.compile(r"(input|output|kernel) size", re.IGNORECASE)


def _check_image_size(model, images, config: RunConfig) -> None:
    """One image through the model, so that an image too small for it is a clear error
    on every rank now rather than a shape error deep inside the first step."""
    import torch

    model.eval()
    try:
        with torch.no_grad():
            model(images[:1])
    except RuntimeError as e:
        first = (str(e).splitlines() or [""])[0]
        if not TOO_SMALL.search(first):
            raise  # out of memory, a cuDNN or CUDA error: not the user's image size
        raise UsageError(f"argument --image-size: {config.image_size} is too small for "
                         f"{config.model} ({first})")
    finally:
        model.train()


def _trainable(model, config: RunConfig, device):
    """The model and its SGD optimizer, as a plugin gets them (under --amp's autocast)."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    return precision.mixed_precision(model, optimizer, config.amp, device)


class IterationReport:
    """After each timed iteration (outside the timed region): the mean throughput
    and loss over all workers, and for decentralized strategies the consensus
    distance; rank 0 prints them."""

    def __init__(self, ctx, config: RunConfig, model, decentralized: bool, say: Printer):
        self.ctx, self.model, self.say = ctx, model, say
        self.images = config.batch_size * config.num_batches_per_iter
        self.decentralized = decentralized
        self.consensus: List[float] = []

    def __call__(self, i: int, timings: Timings) -> None:
        import torch
        import torch.distributed as dist

        sums = torch.tensor([self.images / timings.iteration_seconds[-1], timings.loss[-1]],
                            dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(sums)
        rate, loss = (sums / self.ctx.world_size).tolist()
        line = f"Iter #{i}: {rate:.1f} img/sec per {self.ctx.device_kind}, loss {loss:.4f}"
        if self.decentralized:
            self.consensus.append(consensus_distance(self.model, self.ctx.world_size))
            line += f", consensus distance {self.consensus[-1]:.3g}"
        self.say(line)


def consensus_distance(model, world_size: int) -> float:
    """Mean over workers of ||x_r - mean x||^2 / ||mean x||^2 (see commbench.metrics)."""
    import torch
    import torch.distributed as dist

    x = _flat_parameters(model)
    mean = x.clone()  # summed in the parameters' own precision: half the bytes of float64
    dist.all_reduce(mean)
    mean /= world_size
    x, mean = x.double(), mean.double()
    gap = torch.stack([(x - mean).pow(2).sum(), mean.pow(2).sum()])
    dist.all_reduce(gap)  # the second entry is world_size * ||mean||^2
    return float(gap[0] / gap[1]) if gap[1] > 0 else 0.0


def _flat_parameters(model):
    import torch

    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _gather_samples(ctx, timings: Timings, reference, model, consensus) -> Dict[str, Any]:
    import torch.distributed as dist

    flat = _flat_parameters(model).cpu().numpy()
    mine = {
        "iteration_seconds": timings.iteration_seconds,
        "batch_seconds": timings.batch_seconds,
        "loss": timings.loss,
        "reference_seconds": reference.timings.iteration_seconds if reference else None,
        "reference_batch_seconds": reference.timings.batch_seconds if reference else None,
        "reference_windows": reference.windows if reference else None,
        "reference_phase_seconds": reference.phase_seconds if reference else None,
        "parameter_digest": hashlib.sha256(flat.tobytes()).hexdigest()[:16],
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


def _result_document(config: RunConfig, ctx, strategy, samples) -> Dict[str, Any]:
    summary = metrics.summarize(config.batch_size, config.num_batches_per_iter,
                                samples["iteration_seconds"], samples["batch_seconds"],
                                samples["reference_seconds"], samples["reference_windows"])
    summary["oversubscribed"] = oversubscribed(ctx)
    summary["parameters_identical"] = len(set(samples["parameter_digests"])) == 1
    summary["final_loss"] = sum(r[-1] for r in samples["loss"]) / ctx.world_size
    summary["final_consensus_distance"] = (samples["consensus_distance"] or [None])[-1]
    summary["step_split"] = spans.summarize(samples["step_split"])
    doc = results.new_document("run")
    doc.update(config=config.to_dict(),
               strategy={"name": type(strategy).name,
                         "decentralized": type(strategy).decentralized, **strategy.facts()},
               environment=environment.collect(ctx), samples=samples, summary=summary)
    return doc


def oversubscribed(ctx) -> Optional[Dict[str, Any]]:
    """The most loaded machine when CPU workers outnumber its physical cores (each
    worker then shares cores and the run measures CPU sharing, not communication)."""
    if ctx.device.type != "cpu":
        return None  # more ranks than GPUs on a machine is refused at start-up
    host, workers, cores = max(ctx.machine_load(), key=lambda m: m[1] / m[2])
    return {"machine": host, "workers": workers, "physical_cores": cores} \
        if workers > cores else None


def _result_stem(config: RunConfig, ctx, strategy) -> str:
    parts = [config.model, type(strategy).name]
    topology = strategy.facts().get("topology")
    if topology:
        parts.append(topology)
    return "-".join(parts + [f"n{ctx.world_size}"])


def _print_header(say: Printer, config: RunConfig, ctx, strategy) -> None:
    kind = ctx.device_kind
    images = "synthetic" if config.data == "synthetic" else "learnable"
    say(f"Model: {config.model} ({config.image_size}x{config.image_size} {images} images)")
    say(f"Batch size: {config.batch_size} per {kind}")
    say(f"Number of {kind}s: {ctx.world_size} (launcher: {ctx.launch.launcher}, "
        f"{ctx.num_machines} machine(s))")
    crowded = oversubscribed(ctx)
    if crowded:
        say(f"Oversubscribed: {crowded['workers']} workers on {crowded['machine']}, which has "
            f"{crowded['physical_cores']} physical core(s): this run measures CPU sharing, "
            "not communication")
    say(f"Strategy: {strategy.name} - {strategy.summary}")
    transport = strategy.facts().get("transport", ctx.backend)
    moved = f" (CPU tensors move over {transport})" if transport != ctx.backend else ""
    say(f"Backend: {ctx.backend} on {ctx.device}{moved}")
    if ctx.rank == 0:
        from commbench.launch.mpirun_front import missing_front

        warning = missing_front()
        if warning:
            say(f"Warning: {warning}")


def _print_summary(say: Printer, summary: Dict[str, Any], ctx) -> None:
    kind = ctx.device_kind
    per, total = summary["img_sec_per_worker"], summary["total_img_sec"]
    say(f"Img/sec per {kind}: {per['mean']:.1f} +-{per['spread']:.1f}")
    say(total_line(summary, kind))
    if total["ci95"] is not None:
        say(f"  (+- is 1.96 std of the {total['n']} iterations; 95% confidence interval of "
            f"the mean: {total['mean'] - total['ci95']:.1f} .. {total['mean'] + total['ci95']:.1f})")
    lat = summary["latency_seconds_per_batch"]
    say("Latency per batch: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in lat.items()))
    say(split_line(summary.get("step_split")))
    if "efficiency_in_job" in summary:
        efficiency = percent(summary["efficiency_in_job"], summary.get("efficiency_in_job_ci95"))
        overhead = percent(summary["communication_overhead"],
                           summary.get("communication_overhead_ci95"))
        say(f"Compute-only: {summary['compute_only_img_sec_per_worker']:.1f} img/sec per "
            f"{kind}; in-job scaling efficiency {efficiency}; communication overhead {overhead}")
    for flag in metrics.trust_flags(summary):
        say(f"NOT TO BE TRUSTED ({flag}): {metrics.FLAGS[flag]}")


def split_line(split: Optional[Dict[str, Any]]) -> str:
    """Where a step's time went, in means that add up to the step's."""
    if split is None:
        return ("Step split: not measured (this strategy's engine communicates inside its "
                "own optimizer step, out of commbench's sight)")
    ms = {part: 1000 * split[part]["mean"] for part in spans.PARTS}
    return (f"Step split (mean per step): {ms['step']:.1f} ms = compute {ms['compute']:.1f} + "
            f"exposed communication {ms['exposed']:.1f} + waiting for peers "
            f"{ms['waiting']:.1f} + other {ms['other']:.1f}; communication hidden behind "
            f"compute {ms['overlapped']:.1f}")


def percent(value: float, ci) -> str:
    """A fraction as a percentage, with its 95% CI where known."""
    shown = f"{100 * value:.1f}%"
    if ci is None:
        return shown
    return f"{shown} (95% CI {100 * (value - ci):.1f}..{100 * (value + ci):.1f}%)"


def total_line(summary: Dict[str, Any], kind: str) -> str:
    """The run's headline, as printed at its end (and by `sweep` for each job)."""
    total = summary["total_img_sec"]
    return (f"Total img/sec on {summary['workers']} {kind}(s): {total['mean']:.1f} "
            f"+-{total['spread']:.1f}")
