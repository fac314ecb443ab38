"""`commbench run` (the default subcommand): one benchmark job on every rank.

Flags -> RunConfig -> who am I -> process group -> plugin wraps model and
optimizer -> compute-only reference -> warm-up and timed iterations -> samples of
every rank gathered to rank 0 -> summary -> one result file written by rank 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Callable, Dict, List, Optional

from commbench import registry
from commbench.job import accuracy_loop, console, per_iteration, precision, straggler
from commbench.result import environment, metrics, record, store
from commbench.timing import gpu_kernels, spans, trace_file
from commbench.job.allocator import steady_malloc
from commbench.config.run_config import RunConfig, add_run_arguments, config_from_args
from commbench.data import batches, partition
from commbench.data.local import LocalDataset
from commbench.errors import UsageError
from commbench.launch.detect import LaunchInfo, detect_launch
from commbench.job.speed_loop import LossWatch, device_sync, measure, warm_up
from commbench.job.compute_only import ComputeOnly, phase_medians
from commbench.job.models import build_model, check_input, model_names
from commbench.job.recipe import Recipe


add_arguments = add_run_arguments


def main(args) -> int:
    run(config_from_args(args))
    return 0


def run(config: RunConfig) -> Dict[str, Any]:
    steady_malloc()  # first: every measurement of the job in one allocation regime
    launch = detect_launch()
    strategy_cls = validate(config, launch)
    store.ensure_writable(config.results_dir)
    # The summary after the run needs scipy's statistics: loaded now, a failure to
    # load them (its shared objects mapped into a process the engines have grown)
    # cannot lose a finished run.
    metrics.load_statistics()

    import torch

    from commbench.launch.distributed import init_distributed

    ctx = init_distributed(launch, config.no_cuda, config.timeout, config.machine_size)
    say = console.Printer(ctx.rank == 0)
    _check_same_config(ctx, config)
    precision.check(config.amp, ctx.device.type)
    if ctx.device.type == "cuda":
        # As Horovod's synthetic benchmark does: cuDNN picks its fastest kernels for
        # these fixed shapes during warm-up (recorded in the result's environment).
        torch.backends.cudnn.benchmark = True
    strategy = strategy_cls(ctx, config)
    # Taken now, not after the measurement: nothing between the measurement and the
    # result's write that could fail (a package's metadata, a git subprocess).
    machine = environment.collect(ctx) if ctx.rank == 0 else None

    data = _batches(config, ctx)
    config = dataclasses.replace(config, num_classes=data.classes)  # recorded: what was used
    torch.manual_seed(config.seed + (ctx.rank if config.independent_init else 0))
    model = build_model(config.model, data.classes).to(ctx.device)
    images, labels = data.next()
    check_input(model, images, config.model, config.image_size, config.batch_size)
    sync = device_sync(ctx.device)
    console.print_header(say, config, ctx, strategy)
    if ctx.rank == 0:
        from commbench.launch.mpirun_front import missing_front

        warning = missing_front()
        if warning:
            say(f"Warning: {warning}")
    _slow_down(config, ctx, model, images, labels, sync, say)
    if "class_mix" in data.facts:
        augment = f", {data.facts['augment']} augmentation" if "augment" in data.facts else ""
        say(f"Data: {data.facts['data']}{augment}, {data.facts['steps_per_epoch']} steps per "
            f"epoch; partition {config.partition}: "
            f"{partition.describe(data.facts['class_mix'])}")

    if config.trains_to_accuracy:
        return _train_to_accuracy(config, ctx, strategy, model, data, sync, say, machine)
    return _measure_speed(config, ctx, strategy, model, data, (images, labels), sync, say,
                          machine)


def _slow_down(config: RunConfig, ctx, model, images, labels, sync, say) -> None:
    """Make this rank a straggler where --slow-ranks names it: its compute phases are
    measured alone first, and its steps then idle in proportion (commbench.job.straggler)."""
    slow = straggler.parse(config.slow_ranks)
    straggler.install(None)
    if not slow.on:
        return
    say(f"Stragglers on purpose (--slow-ranks): {slow.describe()}; the compute-only "
        "reference is not slowed")
    if ctx.rank in slow.ranks:
        seconds = phase_medians(lambda twin: _trainable(twin, config, ctx.device,
                                                        Recipe.for_speed(config)),
                                model, images, labels, sync)
        straggler.install(straggler.Straggler(slow, seconds, config.seed, ctx.rank, sync))


def _measure_speed(config: RunConfig, ctx, strategy, model, data: batches.Batches, batch,
                   sync, say, machine: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The speed benchmark: the compute-only reference's first half, warm-up, the timed
    iterations, the reference's second half, then the result."""
    speed = Recipe.for_speed(config)
    reference = None
    if config.reference_iters and type(strategy).name != "none":
        say("Measuring the compute-only reference...")
        reference = ComputeOnly(lambda twin: _trainable(twin, config, ctx.device, speed), model,
                                config, *batch, sync)
        reference.half()

    step = strategy.wrap(*_trainable(model, config, ctx.device, speed))
    progress = per_iteration.AfterIteration(
        ctx, config, model, type(strategy).decentralized,
        lambda means: say(console.iteration_line(means, ctx.device_kind)))

    def after_iteration(i, timings) -> None:
        strategy.settle()  # before commbench's own collectives
        progress(i, timings)

    say("Running warmup...")
    watch = LossWatch()
    warm_up(lambda: step(*data.next()), sync, config.num_warmup_batches, watch)
    say("Running benchmark...")
    spans.RECORDER.reset()
    with gpu_kernels.kernels_of_steps(ctx.device, config.timeline is not None, spans.RECORDER):
        timings = measure(lambda: step(*data.next()), sync, config.num_iters,
                          config.num_batches_per_iter, after_iteration=after_iteration,
                          recorder=spans.RECORDER, watch=watch)
    if reference is not None:
        say("Measuring the compute-only reference again...")
        reference.half()

    unwritten = record.finish(config, ctx, strategy, record.Speed(
        timings, reference, model, progress.consensus, data.facts), machine)
    steps = len(timings.batch_seconds) * config.num_batches_per_iter
    return _tell(say, config, ctx, unwritten, steps,
                 lambda summary: console.print_summary(say, summary, ctx))


def _tell(say, config: RunConfig, ctx, unwritten: Optional[record.Unwritten], steps: int,
          print_summary: Callable[[Dict[str, Any]], None]) -> Dict[str, Any]:
    """The end of either kind of run. Rank 0 prints the summary before it writes, so
    that a result that cannot be written (a full disk) loses no number the console has
    not shown; once every rank knows it was written, where the timeline went and the
    result's path. The result's document on rank 0, {} elsewhere."""
    if unwritten is not None:
        print_summary(unwritten.doc["summary"])
        if unwritten.doc["strategy"].get("meetings") == 0:  # a periodic strategy's facts
            say(f"Warning: the models never met in {steps} steps; the workers trained alone")
    recorded = record.written_by_rank_0(ctx, lambda: record.write(config, *unwritten))
    if recorded is None:
        return {}
    timeline_lines(say, config, steps, recorded)
    say(f"Result: {recorded.path}")
    return recorded.doc


def timeline_lines(say, config: RunConfig, steps: int, recorded: record.Recorded) -> None:
    """Where the --timeline file went, and how much of the run it holds; or, when it
    could not be written, a warning that says so (the result was written first)."""
    if config.timeline is None:
        return
    if recorded.timeline_error:
        say(f"Warning: the timeline was not written ({recorded.timeline_error}); the "
            "result was")
    else:
        window = "" if steps <= config.timeline_steps else \
            f" (the last {config.timeline_steps} of {steps} steps: --timeline-steps)"
        say(f"Timeline: {config.timeline}{window}")
    if recorded.doc["strategy"].get("engine_timeline"):
        say(f"The engine's own timeline: {recorded.doc['strategy']['engine_timeline']}")


def _train_to_accuracy(config: RunConfig, ctx, strategy, model, data: batches.Batches, sync,
                       say, machine: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    per_epoch = data.facts["steps_per_epoch"]
    rule = accuracy_loop.StopRule.of(config, per_epoch)
    accuracy_loop.check_length(type(strategy), config, rule, per_epoch)
    total_batch = config.batch_size * ctx.world_size
    recipe = Recipe.for_accuracy(config, total_batch, per_epoch, rule.max_steps)
    trained, optimizer = _trainable(model, config, ctx.device, recipe)
    step = strategy.wrap(trained, optimizer)

    def train_step(index: int, training_seconds: float):
        recipe.apply(optimizer, index, training_seconds)
        return step(*data.next())

    twin = build_model(config.model, data.classes).to(ctx.device)
    evaluator = accuracy_loop.Evaluator(model, twin, batches.validation(
        data.task, config.image_size, config.seed, ctx.device), ctx)

    def evaluate():
        strategy.settle()  # before the evaluation's collectives
        return evaluator()

    console.training_plan(say, rule, per_epoch, recipe)
    outcome = accuracy_loop.train(
        train_step, sync, rule, evaluate, model, ctx, total_batch, per_epoch,
        lambda point: say(console.point_line(point)), config.timeline_steps,
        strategy.sees_wire)
    unwritten = record.finish(config, ctx, strategy, record.Trained(
        dict(outcome), data.facts, recipe.facts()), machine)

    def print_summary(summary: Dict[str, Any]) -> None:
        console.print_outcome(say, summary)
        say(console.split_line(summary["step_split"], ctx.device.type))

    return _tell(say, config, ctx, unwritten, outcome["steps"], print_summary)


def _batches(config: RunConfig, ctx) -> batches.Batches:
    task = batches.parse(config.data, config.seed, config.augment)
    if task is None:
        return batches.synthetic(config.batch_size, config.image_size, config.num_classes,
                                 ctx.device, seed=config.seed + 7919 * (ctx.rank + 1))
    make = batches.from_path if isinstance(task, LocalDataset) else batches.learnable
    return make(task, config.partition, config.batch_size, config.image_size, ctx.rank,
                ctx.world_size, ctx.device, config.seed)


def validate(config: RunConfig, launch: LaunchInfo):
    """Everything that can be wrong with the request, checked before any communication
    so that all ranks fail alike instead of waiting on each other. Returns the plugin."""
    strategy_cls = registry.resolve(config.dist_optimizer)
    why_not = registry.usable_reason(strategy_cls)
    if why_not:
        raise UsageError(f"argument --dist-optimizer: {strategy_cls.name} cannot run here: "
                         f"{why_not}")
    strategy_cls.check(config, launch)
    registry.refuse_others_options(strategy_cls, config)
    straggler.check(config.slow_ranks, launch.world_size)
    batches.parse(config.data, config.seed, config.augment)
    partition.parse(config.partition)
    accuracy_loop.check(config)
    if config.timeline is not None:
        trace_file.check_new(config.timeline, "--timeline")
    if config.model not in model_names():
        build_model(config.model, config.num_classes)  # raises the UsageError
    return strategy_cls


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


def _trainable(model, config: RunConfig, device, recipe: Recipe):
    """The model and its optimizer, as a plugin gets them (under --amp's autocast)."""
    optimizer = recipe.optimizer(model.parameters())
    return precision.mixed_precision(model, optimizer, config.amp, device)
