"""What serving a learnable task's batches costs a run: commbench's run on the fixed
synthetic batch and on the worker's shard of a learnable task (`--data learnable`),
alternating rounds in one job, so that the machine's drift hits both alike.

    mpiexec -n 2 python benchmarks/data_cost.py [--rounds 5] [run flags]

Prints each round and the ratio learnable/synthetic of total img/sec, as the ratio of
medians and as the median of the paired rounds. Target (issue: time to accuracy):
>= 0.95, so that loading data is never what a run measures.
"""

import dataclasses
import tempfile

import torch.distributed as dist

from commbench.config import config_from_args
from commbench.launch.detect import detect_launch
from commbench.launch.distributed import init_distributed
from harness import commbench_rate, parser, ratio, report_rounds


def main() -> None:
    args = parser(__doc__, model="resnet18", image_size=32, num_iters=5,
                  reference_iters=0, dist_optimizer="allreduce", rounds=5).parse_args()
    with tempfile.TemporaryDirectory() as results_dir:
        args.results_dir = results_dir
        config = config_from_args(args)
        ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)
        learnable = dataclasses.replace(config, data="learnable:samples=4000")
        rates = {"synthetic": [], "learnable": []}
        for _ in range(args.rounds):
            rates["synthetic"].append(commbench_rate(config))
            rates["learnable"].append(commbench_rate(learnable))
            report_rounds(rates, ctx.rank)
        dist.barrier()
    if ctx.rank == 0:
        print(f"{config.dist_optimizer}, {config.model} {config.image_size}px batch "
              f"{config.batch_size}, {ctx.world_size} workers:")
        print(f"  learnable/synthetic = {ratio(rates, 'learnable', 'synthetic')}; "
              "target >= 0.95")


if __name__ == "__main__":
    main()
