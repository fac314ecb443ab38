"""commbench's own neighbor_allreduce against Bluefog's (bluefog.neighbor_allreduce)
on the same model, batch, topology and schedule, same job, alternating rounds.
Runs in the Bluefog environment (scripts/setup_bluefog_env.sh):

    .venv-bluefog/bin/bfrun -np 4 --extra-mpi-flags="--oversubscribe" .venv-bluefog/bin/python \
        benchmarks/bluefog_vs_commbench.py [--model resnet50 --image-size 32]

Prints each round and the ratio of total img/sec (commbench / Bluefog), as the ratio
of medians and as the median of the paired rounds; the target is >= 1. (bfrun already
passes --bind-to none.)
"""

import tempfile

from commbench.config import config_from_args
from commbench.launch.distributed import init_distributed
from commbench.launch.detect import detect_launch
from harness import commbench_rate, parser, ratio, report_rounds


def main() -> None:
    args = parser(__doc__, model="squeezenet1_1", image_size=64, num_classes=10,
                  batch_size=16, num_iters=5, num_batches_per_iter=5, num_warmup_batches=3,
                  reference_iters=0, timeout=120.0).parse_args()
    with tempfile.TemporaryDirectory() as results_dir:
        args.results_dir = results_dir
        arms = {"commbench": "neighbor_allreduce", "bluefog": "bluefog.neighbor_allreduce"}
        rates = {arm: [] for arm in arms}
        ctx = None
        for _ in range(args.rounds):
            for arm, plugin in arms.items():
                args.dist_optimizer = plugin
                config = config_from_args(args)
                ctx = ctx or init_distributed(detect_launch(), config.no_cuda, config.timeout)
                rates[arm].append(commbench_rate(config))
            report_rounds(rates, ctx.rank)
    if ctx.rank == 0:
        print(f"{config.model} {config.image_size}px batch {config.batch_size}, "
              f"{ctx.world_size} workers, {config.topology} "
              f"{'static' if config.disable_dynamic_topology else 'dynamic'}: "
              f"commbench/Bluefog = {ratio(rates, 'commbench', 'bluefog')}; target >= 1")


if __name__ == "__main__":
    main()
