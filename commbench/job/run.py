"""`commbench run` (the default subcommand): one benchmark job on every rank.

Flags -> RunConfig -> who am I -> process group -> plugin wraps model and
optimizer -> compute-only reference -> warm-up and timed iterations -> samples of
every rank gathered to rank 0 -> summary -> one result file written by rank 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

from commbench.faults import fail_inject, recovery, torchft_group
from commbench.job import (accuracy_loop, console, language_models, per_iteration, precision,
                           recipe as recipes, stop_rule, straggler)
from commbench.result import environment, record
from commbench.timing import gpu_kernels, spans
from commbench.config.run_config import RunConfig, add_run_arguments, config_from_args
from commbench.data import batches, partition
from commbench.data.local import LocalDataset
from commbench.data.text import TextCorpus
from commbench.job.speed_loop import LossWatch, device_sync, measure, warm_up
from commbench.job.compute_only import ComputeOnly, phase_medians
from commbench.job.models import build_model, check_input
from commbench.job.run_checks import check_same_config, validate
from commbench.faults.recovery_hook import Recovery
from commbench.faults.restart import Restart
from commbench.job.startup import start
from commbench.job.training_step import slowed_by


add_arguments = add_run_arguments


def main(args) -> int:
    run(config_from_args(args))
    return 0


def run(config: RunConfig) -> Dict[str, Any]:
    strategy_cls, ctx, say = start(config, lambda launch: validate(config, launch))

    import torch

    check_same_config(ctx, config)
    # Recorded as resolved: "auto" becomes what the model trains in on this device.
    config = dataclasses.replace(config, amp=precision.resolve(
        config.amp, config.language_model is not None, ctx.device))
    precision.check(config.amp, ctx.device.type)
    if ctx.device.type == "cuda":
        # As Horovod's synthetic benchmark does: cuDNN picks its fastest kernels for
        # these fixed shapes during warm-up (recorded in the result's environment).
        torch.backends.cudnn.benchmark = True
    strategy = strategy_cls(ctx, config)
    # Taken now, not after the measurement: nothing between the measurement and the
    # result's write that could fail (a package's metadata, a git subprocess).
    machine = environment.collect(ctx) if ctx.rank == 0 else None

    worker = torchft_group.as_worker(ctx)  # a replica group's index and count under torchft
    data = _batches(config, worker)
    # Recorded: what was used (a language model's vocabulary, its sequence length).
    config = dataclasses.replace(config, num_classes=data.classes,
                                 seq_len=config.per_sample if config.language_model else None)
    torch.manual_seed(config.seed + (ctx.rank if config.independent_init else 0))
    model = build_model(config.model, data.classes)
    model_facts = language_models.facts(config.model, model, config.seq_len)
    model = model.to(ctx.device)
    images, labels = data.next()
    check_input(model, images, config.model, config.image_size, config.batch_size)
    sync = device_sync(ctx.device)
    console.print_header(say, config, ctx, strategy)
    if ctx.rank == 0:
        from commbench.launch.mpirun_front import missing_front

        warning = missing_front()
        if warning:
            say(f"Warning: {warning}")
    slow = _slow_down(config, ctx, model, images, labels, sync, say)
    fails = fail_inject.injector(config.fail, worker.world_size, worker.rank, config.timeout)
    if config.fail != "none":
        say(f"Failures on purpose (--fail): "
            f"{fail_inject.describe(config.fail, worker.world_size)}; "
            f"{recovery.after_failure(config.recovery)}")
    if "class_mix" in data.facts:
        augment = f", {data.facts['augment']} augmentation" if "augment" in data.facts else ""
        say(f"Data: {data.facts['data']}{augment}, {data.facts['steps_per_epoch']} steps per "
            f"epoch; partition {config.partition}: "
            f"{partition.describe(data.facts['class_mix'])}")
    if "entropy_rate" in data.facts:
        say(f"{data.task.floor_line()}; {data.facts['steps_per_epoch']} steps per epoch")
    if "shards" in data.facts:
        say(console.text_line(data.facts))

    if config.trains_to_accuracy:
        return _train_to_accuracy(config, ctx, strategy, model, data, sync, say, machine, slow,
                                  fails)
    return _measure_speed(config, ctx, strategy, model, data, (images, labels), sync, say,
                          machine, slow, model_facts, fails)


def _slow_down(config: RunConfig, ctx, model, images, labels, sync,
               say) -> Optional[straggler.Straggler]:
    """This rank's straggler where --slow-ranks names it (None elsewhere): its compute
    phases are measured alone first, and its steps then idle in proportion
    (commbench.job.straggler)."""
    slow = straggler.parse(config.slow_ranks)
    if not slow.on:
        return None
    say(f"Stragglers on purpose (--slow-ranks): {slow.describe()}; the compute-only "
        "reference is not slowed")
    if ctx.rank not in slow.ranks:
        return None
    seconds = phase_medians(lambda twin: _trainable(twin, config, ctx.device,
                                                    recipes.for_speed(config)),
                            model, images, labels, sync)
    return straggler.Straggler(slow, seconds, config.seed, ctx.rank, sync)


def _measure_speed(config: RunConfig, ctx, strategy, model, data: batches.Batches, batch,
                   sync, say, machine: Optional[Dict[str, Any]],
                   slow: Optional[straggler.Straggler], model_facts: Dict[str, Any],
                   fails: fail_inject.Injector) -> Dict[str, Any]:
    """The speed benchmark: the compute-only reference's first half, warm-up, the timed
    iterations, the reference's second half, then the result. Only the measured steps
    are recorded; a slowed rank's steps idle from warm-up on, and --fail counts steps
    from warm-up on."""
    speed = recipes.for_speed(config)
    if config.language_model:  # AdamW, not the benchmarks' SGD: said and recorded
        say(speed.describe())
    reference = None
    if config.reference_iters and type(strategy).name != "none":
        say("Measuring the compute-only reference...")
        reference = ComputeOnly(lambda twin: _trainable(twin, config, ctx.device, speed), model,
                                config, *batch, sync)
        reference.half()

    with slowed_by(slow):  # the strategy's step owns this rank's straggler
        step = strategy.wrap(*_trainable(model, config, ctx.device, speed))
    recorder = spans.Recorder()
    progress = per_iteration.AfterIteration(
        ctx, config, model, type(strategy).decentralized,
        lambda means: say(console.iteration_line(means, ctx.device_kind, config.unit)),
        recorder)

    def after_iteration(i, timings) -> None:
        strategy.settle()  # before commbench's own collectives
        progress(i, timings)

    say("Running warmup...")
    watch = LossWatch()
    next_step = fails.around(lambda: step(*data.next()))
    warm_up(next_step, sync, config.num_warmup_batches, watch)
    say("Running benchmark...")
    with gpu_kernels.kernels_of_steps(ctx.device, config.timeline is not None, recorder):
        timings = measure(next_step, sync, config.num_iters,
                          config.num_batches_per_iter, after_iteration=after_iteration,
                          recorder=recorder, watch=watch)
    if reference is not None:
        say("Measuring the compute-only reference again...")
        reference.half()

    unwritten = record.finish(config, ctx, strategy, record.Speed(
        timings, reference, model, progress.consensus, data.facts, model_facts,
        speed.facts() if config.language_model else {}), machine,
        recorder, slow)
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
        _record_failures(say, config, ctx, unwritten.doc)
        print_summary(unwritten.doc["summary"])
        if unwritten.doc["strategy"].get("meetings") == 0:  # a periodic strategy's facts
            say(f"Warning: the models never met in {steps} steps; the workers trained alone")
    if unwritten is None and ctx.world_size == 1:  # a torchft group but the first
        return {}
    recorded = record.written_by_rank_0(ctx, lambda: record.write(config, *unwritten))
    if recorded is None:
        return {}
    console.timeline_lines(say, config, steps, recorded)
    say(f"Result: {recorded.path}")
    return recorded.doc


def _record_failures(say, config: RunConfig, ctx, doc: Dict[str, Any]) -> None:
    """The --fail schedule in the result; rank 0 says when none of them fired (with no
    recovery policy a failure ends the job; what a restart cost is said apart)."""
    recorded = fail_inject.facts(config.fail, ctx.world_size)
    if recorded is not None:
        doc["failures"] = recorded
    if recorded is not None and not doc.get("recovery", {}).get("costs"):
        say(f"Warning: --fail {config.fail}: the run ended before any of its failures was "
            "due; nothing failed")


def _train_to_accuracy(config: RunConfig, ctx, strategy, model, data: batches.Batches, sync,
                       say, machine: Optional[Dict[str, Any]],
                       slow: Optional[straggler.Straggler],
                       fails: fail_inject.Injector) -> Dict[str, Any]:
    per_epoch = data.facts["steps_per_epoch"]
    rule = stop_rule.StopRule.of(config, per_epoch)
    accuracy_loop.check_length(type(strategy), config, rule, per_epoch)
    total_batch = config.batch_size * torchft_group.identity(ctx.rank, ctx.world_size)[1]
    recipe = recipes.for_accuracy(config, total_batch, per_epoch, rule.max_steps)
    trained, optimizer = _trainable(model, config, ctx.device, recipe)
    schedule = recipe.scheduler(optimizer)
    replica = torchft_group.Replica(config, ctx, say, config.batch_size * config.per_sample,
                                    strategy) if config.recovery == "torchft" else None
    with slowed_by(slow):  # the strategy's step owns this rank's straggler
        step = (replica or strategy).wrap(trained, optimizer)

    @fails.around
    def train_step(index: int, training_seconds: float):
        schedule(index, training_seconds)
        return step(*data.next())

    twin = build_model(config.model, data.classes).to(ctx.device)
    evaluator = accuracy_loop.Evaluator(model, twin, batches.validation(
        data.task, config.image_size, config.seed, ctx.device, config.per_sample), ctx)

    def evaluate():
        strategy.settle()  # before the evaluation's collectives
        return evaluator()

    # Restart's last: the RNG state it restores is training's.
    policy = (replica or strategy.own_recovery()
              or (Restart(config, ctx, say) if config.recovery == "restart"
                  else Recovery()))
    policy.begin(fails, model, optimizer, data.next)
    console.training_plan(say, rule, per_epoch, recipe)
    recorder = spans.Recorder()
    crowded = per_iteration.oversubscribed(ctx)  # as started: gossip's survivors shrink it
    outcome = accuracy_loop.train(
        # a language model's samples are its tokens
        train_step, sync, rule, evaluate, model, ctx, total_batch * config.per_sample, per_epoch,
        lambda point: say(console.point_line(point)), config.timeline_steps, recorder,
        strategy.sees_wire, policy)
    unwritten = record.finish(config, ctx, strategy, record.Trained(
        dict(outcome), data.facts, recipe.facts(), crowded), machine, recorder, slow)
    if not policy.ended(outcome["steps"], model):
        unwritten = None  # torchft's group 0 writes the result (torchft_group)
    facts = policy.facts(outcome, model) if unwritten is not None else None  # rank 0's
    if facts is not None:
        unwritten.doc["recovery"] = facts

    def print_summary(summary: Dict[str, Any]) -> None:
        console.print_outcome(say, summary)
        for line in policy.lines(facts, summary["img_sec"], config.unit):
            say(line)
        say(console.split_line(summary["step_split"], ctx.device.type))

    told = _tell(say, config, ctx, unwritten, outcome["steps"], print_summary)
    policy.leave()  # gossip's survivors end here (gossip_recovery)
    return told


def _batches(config: RunConfig, ctx) -> batches.Batches:
    task = batches.parse(config.data, config.seed, config.augment)
    seed = config.seed + 7919 * (ctx.rank + 1)  # a synthetic batch of each worker's own
    if isinstance(task, TextCorpus):
        return batches.text(task, config.partition, config.batch_size, config.per_sample,
                            ctx.rank, ctx.world_size, ctx.device, config.seed)
    if config.language_model is not None and task is not None:
        return batches.language(task, config.batch_size, config.per_sample, ctx.rank,
                                ctx.world_size, ctx.device, config.seed)
    if config.language_model is not None:
        return batches.synthetic_tokens(config.batch_size, config.per_sample,
                                        config.language_model.vocab, ctx.device, seed=seed)
    if task is None:
        return batches.synthetic(config.batch_size, config.image_size, config.num_classes,
                                 ctx.device, seed=seed)
    make = batches.from_path if isinstance(task, LocalDataset) else batches.learnable
    return make(task, config.partition, config.batch_size, config.image_size, ctx.rank,
                ctx.world_size, ctx.device, config.seed)


def _trainable(model, config: RunConfig, device, recipe: recipes.AnyRecipe):
    """The model and its optimizer, as a plugin gets them (under --amp's autocast)."""
    optimizer = recipe.optimizer(model.parameters())
    return precision.mixed_precision(model, optimizer, config.amp, device)
