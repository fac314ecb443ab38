"""Do two engines of one strategy compute the same thing? Run under a launcher:

    mpiexec -n N python tests/programs/engine_agreement.py allreduce horovod [run flags]
    bfrun -np N python tests/programs/engine_agreement.py neighbor_allreduce \
        bluefog.neighbor_allreduce --disable-dynamic-topology

Each plugin trains a copy of one model (same initial parameters on every rank, as
`commbench run` seeds them) on the same per-rank data for --steps steps, through the
plugin exactly as `commbench run` wraps it. Rank 0 prints one JSON line: the largest
absolute and relative difference of any parameter between the two engines, per
rank; the test decides what tolerance means "agree".
"""

from __future__ import annotations

import argparse
import copy

import torch

from commbench import registry
from commbench.config.run_config import add_run_arguments, config_from_args
from commbench.job.recipe import Recipe
from commbench.launch.distributed import init_distributed
from commbench.launch.detect import detect_launch
from commbench.data.batches import synthetic_batch
from commbench.job.models import build_model
from gathered import print_everyones


def train(name, base, config, ctx, images, labels, steps):
    cls = registry.resolve(name)
    cls.check(config, ctx.launch)
    model = copy.deepcopy(base)
    optimizer = Recipe.for_speed(config).optimizer(model.parameters())
    step = cls(ctx, config).wrap(model, optimizer)
    # The same random stream for both engines: dropout (squeezenet's classifier) must
    # drop the same units, or the engines train different networks.
    torch.manual_seed(config.seed + 1 + ctx.rank)
    for _ in range(steps):
        step(images, labels)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--steps", type=int, default=3)
    add_run_arguments(parser)
    parser.set_defaults(model="resnet18", image_size=32, batch_size=8, num_classes=10,
                        lr=0.05)
    args = parser.parse_args()
    config = config_from_args(args)
    ctx = init_distributed(detect_launch(), True, config.timeout, config.machine_size)
    torch.manual_seed(config.seed)
    base = build_model(config.model, config.num_classes)
    images, labels = synthetic_batch(config.batch_size, config.image_size, config.num_classes,
                                     ctx.device, seed=config.seed + 7919 * (ctx.rank + 1))
    a = train(args.first, base, config, ctx, images, labels, args.steps)
    b = train(args.second, base, config, ctx, images, labels, args.steps)
    start = torch.cat([p.detach().reshape(-1) for p in base.parameters()]).double()
    mine = {"max_abs": float((a - b).abs().max()),
            "max_rel": float((a - b).norm() / a.norm()),
            "moved": float((a - start).norm() / start.norm())}  # the steps did something
    print_everyones("AGREEMENT", mine, ctx)


if __name__ == "__main__":
    main()
