"""Does the harness cost anything? commbench's `allreduce` against a minimal
hand-written DDP loop (the shape of Horovod's synthetic benchmark), same
configuration, same job, alternating rounds so that drift hits both alike.

    mpiexec -n 2 python benchmarks/allreduce_overhead.py [--rounds 3] [run flags]

Prints each round and the ratio of median img/sec (commbench / hand-written);
the target is >= 0.98.
"""

import argparse
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel

from commbench.config import RunConfig, add_run_arguments, config_from_args
from commbench.launch.distributed import init_distributed
from commbench.launch.environment import detect_launch
from commbench.run import run


def hand_written(config: RunConfig, rank: int, world: int) -> float:
    """Total img/sec over all workers of the plainest correct DDP loop."""
    torch.manual_seed(config.seed)
    model = DistributedDataParallel(getattr(torchvision.models, config.model)(
        num_classes=config.num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    generator = torch.Generator().manual_seed(config.seed + rank)
    data = torch.randn(config.batch_size, 3, config.image_size, config.image_size,
                       generator=generator)
    target = torch.randint(config.num_classes, (config.batch_size,), generator=generator)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    for _ in range(config.num_warmup_batches):
        step()
    rates = []
    for _ in range(config.num_iters):
        start = time.perf_counter()
        for _ in range(config.num_batches_per_iter):
            step()
        rate = torch.tensor(config.batch_size * config.num_batches_per_iter
                            / (time.perf_counter() - start))
        dist.all_reduce(rate)  # total over workers, as commbench reports it
        rates.append(float(rate))
    return statistics.mean(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    add_run_arguments(parser)
    parser.set_defaults(model="resnet18", image_size=32, num_iters=5, reference_iters=0)
    args = parser.parse_args()
    launch = detect_launch()
    with tempfile.TemporaryDirectory() as results_dir:
        args.results_dir = results_dir
        args.dist_optimizer = "allreduce"
        config = config_from_args(args)
        ctx = init_distributed(launch, config.no_cuda, config.timeout)
        ours, theirs = [], []
        for i in range(args.rounds):
            theirs.append(hand_written(config, ctx.rank, ctx.world_size))
            # commbench prints its own report on rank 0; keep the benchmark's output short.
            sys.stdout, saved = open("/dev/null", "w"), sys.stdout
            try:
                doc = run(config)
            finally:
                sys.stdout = saved
            if ctx.rank == 0:
                ours.append(doc["summary"]["total_img_sec"]["mean"])
                print(f"round {i}: hand-written {theirs[-1]:.1f} img/sec, "
                      f"commbench {ours[-1]:.1f} img/sec", flush=True)
    if ctx.rank == 0:
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"{config.model} {config.image_size}px batch {config.batch_size}, "
              f"{ctx.world_size} workers: commbench/hand-written = {ratio:.3f} "
              f"(target >= 0.98)")


if __name__ == "__main__":
    main()
