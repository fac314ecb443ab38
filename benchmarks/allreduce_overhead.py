"""Does the harness cost anything? commbench's `allreduce` against a minimal
hand-written DDP loop, same configuration, same job, alternating rounds.

    mpiexec -n 2 python benchmarks/allreduce_overhead.py [--rounds 3] [run flags]

Prints each round and the ratio of total img/sec (commbench / hand-written), as the
ratio of medians and as the median of the paired rounds; the target is >= 0.98.
The hand-written loop is plain DDP on gloo, so commbench runs with --cpu-transport
gloo by default here (its MPI averager is a different wire, not harness cost; pass
--cpu-transport mpi to see what it buys).
"""

import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commbench.config import config_from_args
from commbench.launch.distributed import init_distributed
from commbench.launch.detect import detect_launch
from harness import commbench_rate, hand_written, parser, ratio, report_rounds


def ddp(model, optimizer):
    return DistributedDataParallel(model), optimizer


def summed(rate: float) -> float:
    rate = torch.tensor(rate)
    dist.all_reduce(rate)
    return float(rate)


def main() -> None:
    args = parser(__doc__, model="resnet18", image_size=32, num_iters=5,
                  reference_iters=0, cpu_transport="gloo").parse_args()
    with tempfile.TemporaryDirectory() as results_dir:
        args.results_dir, args.dist_optimizer = results_dir, "allreduce"
        config = config_from_args(args)
        ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)
        rates = {"hand-written": [], "commbench": []}
        for _ in range(args.rounds):
            rates["hand-written"].append(hand_written(config, ctx.rank, ddp, summed))
            rates["commbench"].append(commbench_rate(config))
            report_rounds(rates, ctx.rank)
    if ctx.rank == 0:
        print(f"{config.model} {config.image_size}px batch {config.batch_size}, "
              f"{ctx.world_size} workers: commbench/hand-written = "
              f"{ratio(rates, 'commbench', 'hand-written')}; target >= 0.98")


if __name__ == "__main__":
    main()
