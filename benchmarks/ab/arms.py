"""The arms of each in-job contender (the table in contenders.py names these
functions): each takes the parsed flags, starts the job's ranks, and returns the
in_job.Job whose arms the loop alternates. Heavy imports (horovod) stay inside the
function that needs them."""

import dataclasses
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commbench.timing import spans
from commbench.config.run_config import config_from_args
from commbench.launch.detect import detect_launch
from commbench.launch.distributed import init_distributed
from in_job import Job, commbench_rate, hand_written, workload
from paired import ratio


def _summed(rate: float) -> float:
    rate = torch.tensor(rate)
    dist.all_reduce(rate)
    return float(rate)


def allreduce(args) -> Job:
    """commbench's `allreduce` against a hand-written DDP loop (an image model's, or with
    a language model a bare DDP + AdamW loop on the same tokens)."""
    args.dist_optimizer = "allreduce"
    config = config_from_args(args)
    ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)

    def ddp(model, optimizer):
        return DistributedDataParallel(model), optimizer

    return Job(ctx, {
        "hand-written": lambda round_: hand_written(config, ctx.rank, ddp, _summed),
        "commbench": lambda round_: commbench_rate(config),
    }, lambda rates: [(
        f"{workload(config)}, {ctx.world_size} workers: commbench/hand-written = "
        f"{ratio(rates, 'commbench', 'hand-written')}; target >= 0.98")], rotate=True)


def horovod(args) -> Job:
    """commbench's `horovod` plugin against a hand-written Horovod loop (the shape of
    Horovod's pytorch_synthetic_benchmark.py)."""
    import horovod
    import horovod.torch as hvd

    args.dist_optimizer = "horovod"
    config = config_from_args(args)
    ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)
    hvd.init()

    def wrap(model, optimizer):
        compression = hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression,
            op=hvd.Adasum if config.options.get("use_adasum") else hvd.Average)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer

    def summed(rate: float) -> float:
        return float(hvd.allreduce(torch.tensor(rate), op=hvd.Sum))

    return Job(ctx, {
        "hand-written": lambda round_: hand_written(config, ctx.rank, wrap, summed),
        "commbench": lambda round_: commbench_rate(config),
    }, lambda rates: [(
        f"{config.model} {config.image_size}px batch {config.batch_size}, "
        f"{ctx.world_size} workers, Horovod {horovod.__version__} "
        f"{'mpi' if hvd.mpi_enabled() else 'gloo'} controller: commbench/hand-written = "
        f"{ratio(rates, 'commbench', 'hand-written')}; target >= 0.98")])


def bluefog(args) -> Job:
    """commbench's `neighbor_allreduce` against `bluefog.neighbor_allreduce`, each arm
    its own plugin on the same flags."""
    last = {}  # the config of the arm that ran last, for the closing line

    def arm(plugin):
        def rate(round_):
            args.dist_optimizer = plugin
            last["config"] = config_from_args(args)
            return commbench_rate(last["config"])
        return rate

    args.dist_optimizer = "neighbor_allreduce"
    last["config"] = config = config_from_args(args)
    ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)

    def report(rates):
        config = last["config"]
        return [(f"{config.model} {config.image_size}px batch {config.batch_size}, "
                 f"{ctx.world_size} workers, {config.topology} "
                 f"{'static' if config.disable_dynamic_topology else 'dynamic'}: "
                 f"commbench/Bluefog = {ratio(rates, 'commbench', 'bluefog')}; target >= 1")]

    return Job(ctx, {"commbench": arm("neighbor_allreduce"),
                     "bluefog": arm("bluefog.neighbor_allreduce")}, report)


def timeline(args) -> Job:
    """The run with its spans recorded (the default), with `--timeline` on top, and with
    recording switched off in this process; the order rotates."""
    config = config_from_args(args)
    ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)
    shared = [args.results_dir]  # every rank names rank 0's file (the configs must agree)
    dist.broadcast_object_list(shared, 0)

    def unrecorded(round_):
        """A run whose recorder takes nothing (the loop and the steps still call it)."""
        add = spans.Recorder.add
        spans.Recorder.add = lambda self, *args, **kwargs: None
        try:
            return commbench_rate(config)
        finally:
            spans.Recorder.add = add

    return Job(ctx, {
        "off": unrecorded,
        "recorded": lambda round_: commbench_rate(config),
        "timeline": lambda round_: commbench_rate(dataclasses.replace(
            config, timeline=os.path.join(shared[0], f"trace-{round_}.json"))),
    }, lambda rates: [
        (f"{config.dist_optimizer}, {config.model} {config.image_size}px batch "
         f"{config.batch_size}, {ctx.world_size} workers:"),
        f"  recorded/off = {ratio(rates, 'recorded', 'off')}; target: no change",
        f"  timeline/off = {ratio(rates, 'timeline', 'off')}; target >= 0.97"], rotate=True)


def data(args) -> Job:
    """The run on the fixed synthetic batch against the same run on the worker's shard
    of a learnable task."""
    config = config_from_args(args)
    ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)
    learnable = dataclasses.replace(config, data="learnable:samples=4000")
    return Job(ctx, {
        "synthetic": lambda round_: commbench_rate(config),
        "learnable": lambda round_: commbench_rate(learnable),
    }, lambda rates: [
        (f"{config.dist_optimizer}, {config.model} {config.image_size}px batch "
         f"{config.batch_size}, {ctx.world_size} workers:"),
        (f"  learnable/synthetic = {ratio(rates, 'learnable', 'synthetic')}; "
         "target >= 0.95")], after=[dist.barrier])
