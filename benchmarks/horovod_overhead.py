"""Does commbench's `horovod` plugin cost anything? Held against a minimal hand-written
Horovod loop (the shape of Horovod's pytorch_synthetic_benchmark.py), same
configuration, same job, alternating rounds.

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/horovod_overhead.py [--rounds 5]
    horovodrun -np 2 python benchmarks/horovod_overhead.py [--rounds 5] [run flags]

Prints each round and the ratio of total img/sec (commbench / hand-written), as the
ratio of medians and as the median of the paired rounds; the target is >= 0.98.
"""

import tempfile

import horovod
import horovod.torch as hvd
import torch

from commbench.config import config_from_args
from commbench.launch.distributed import init_distributed
from commbench.launch.detect import detect_launch
from harness import commbench_rate, hand_written, parser, ratio, report_rounds


def horovod_wrap(config):
    def wrap(model, optimizer):
        compression = hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression,
            op=hvd.Adasum if config.options.get("use_adasum") else hvd.Average)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer

    return wrap


def summed(rate: float) -> float:
    return float(hvd.allreduce(torch.tensor(rate), op=hvd.Sum))


def main() -> None:
    args = parser(__doc__, model="resnet18", image_size=32, num_iters=5,
                  reference_iters=0).parse_args()
    with tempfile.TemporaryDirectory() as results_dir:
        args.results_dir, args.dist_optimizer = results_dir, "horovod"
        config = config_from_args(args)
        ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)
        hvd.init()
        rates = {"hand-written": [], "commbench": []}
        for _ in range(args.rounds):
            rates["hand-written"].append(
                hand_written(config, ctx.rank, horovod_wrap(config), summed))
            rates["commbench"].append(commbench_rate(config))
            report_rounds(rates, ctx.rank)
    if ctx.rank == 0:
        print(f"{config.model} {config.image_size}px batch {config.batch_size}, "
              f"{ctx.world_size} workers, Horovod {horovod.__version__} "
              f"{'mpi' if hvd.mpi_enabled() else 'gloo'} controller: commbench/hand-written = "
              f"{ratio(rates, 'commbench', 'hand-written')}; target >= 0.98")


if __name__ == "__main__":
    main()
