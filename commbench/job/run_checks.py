"""What can be wrong with a `commbench run` request, found before it costs anything:
the flags checked on every rank before any communication, then that every rank was
started alike, so that every rank fails with the same one line instead of waiting on a
peer that stopped. (Whether the model can train on the images and batch asked for:
commbench.job.models.check_input.)"""

from __future__ import annotations

import json
from typing import Any, List

from commbench import registry
from commbench.faults import fail_schedule, recovery, torchft_group
from commbench.job import language_models, straggler, training_checks
from commbench.timing import trace_file
from commbench.config.run_config import RunConfig
from commbench.data import batches, partition
from commbench.data.text import TextCorpus
from commbench.errors import UsageError
from commbench.launch.detect import REJOINING, LaunchInfo
from commbench.job.models import build_model, model_names


def validate(config: RunConfig, launch: LaunchInfo):
    """Everything that can be wrong with the request, checked before any communication
    so that all ranks fail alike instead of waiting on each other. Returns the plugin."""
    strategy_cls = registry.resolve(config.dist_optimizer)
    why_not = registry.usable_reason(strategy_cls)
    if why_not:
        raise UsageError(f"argument --dist-optimizer: {strategy_cls.name} cannot run here: "
                         f"{why_not}")
    registry.refuse_unread([config.dist_optimizer], config, launch=launch)
    strategy_cls.check(config, launch)
    straggler.check(config.slow_ranks, launch.world_size)
    if config.recovery == "gossip":  # before the schedule's own check: its rejoins
        recovery.check_gossip(config, launch, strategy_cls)
    if config.recovery != "torchft":  # whose events fail replica groups (torchft_group)
        fail_schedule.check(config.fail, launch.world_size, last_step=None
                            if config.trains_to_accuracy else config.num_warmup_batches
                            + config.num_iters * config.num_batches_per_iter,
                            restarts=config.recovery == "restart",
                            rejoins=config.recovery == "gossip")
    recovery.check(config, launch, strategy_cls)
    recovery.check_cut(config)
    if config.recovery == "torchft":
        torchft_group.check(config, launch, strategy_cls)
    task = batches.parse(config.data, config.seed, config.augment)
    partition.parse(config.partition, config.data)
    if isinstance(task, TextCorpus):  # too little text for the run, before it starts
        batches.text_shards(task, config.per_sample, config.partition, launch.world_size,
                            config.seed)
        if config.trains_to_accuracy:
            batches.validation(task, 0, config.seed, seq_len=config.per_sample)
    training_checks.check(config)
    if config.timeline is not None:
        trace_file.check_new(config.timeline, "--timeline")
    if config.language_model is not None:
        language_models.check_installed(config.model)
    elif config.model not in model_names():
        build_model(config.model, config.num_classes)  # raises the UsageError
    return strategy_cls


def check_same_config(ctx, config: RunConfig) -> None:
    """Ranks started with different flags or commbench versions would measure nonsense.
    A rank started again under gossip has no group yet: its flags were checked against
    the job's record (commbench.faults.gossip_rejoin.context)."""
    import torch.distributed as dist

    if ctx.launch.launcher == REJOINING:
        return
    digest, mine = config.started_alike()
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
