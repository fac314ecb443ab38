"""Does commbench's `horovod` plugin cost anything? It against a minimal hand-written
Horovod loop (the shape of Horovod's pytorch_synthetic_benchmark.py), same
configuration, same job, alternating rounds so that drift hits both alike.

    horovodrun -np 2 -H localhost:2 --mpi python benchmarks/horovod_overhead.py [--rounds 3] [run flags]

Prints each round and the ratio of median total img/sec (commbench / hand-written);
the target is >= 0.98.
"""

import argparse
import statistics
import sys
import tempfile
import time

import horovod
import horovod.torch as hvd
import torch
import torch.nn.functional as F
import torchvision

from commbench.config import RunConfig, add_run_arguments, config_from_args
from commbench.launch.distributed import init_distributed
from commbench.launch.environment import detect_launch
from commbench.run import run


def hand_written(config: RunConfig, rank: int) -> float:
    """Total img/sec over all workers of the plainest correct Horovod loop."""
    torch.manual_seed(config.seed)
    model = getattr(torchvision.models, config.model)(num_classes=config.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    compression = hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if config.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
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
        rates.append(float(hvd.allreduce(rate, op=hvd.Sum)))  # total, as commbench reports
    return statistics.mean(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    add_run_arguments(parser)
    parser.set_defaults(model="resnet18", image_size=32, num_iters=5, reference_iters=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as results_dir:
        args.results_dir = results_dir
        args.dist_optimizer = "horovod"
        config = config_from_args(args)
        ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)
        hvd.init()
        ours, theirs = [], []
        for i in range(args.rounds):
            theirs.append(hand_written(config, ctx.rank))
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
              f"{ctx.world_size} workers, Horovod {horovod.__version__} "
              f"{'mpi' if hvd.mpi_enabled() else 'gloo'} controller: "
              f"commbench/hand-written = {ratio:.3f} (target >= 0.98)")


if __name__ == "__main__":
    main()
