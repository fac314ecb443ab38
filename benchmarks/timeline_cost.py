"""What recording where a step's time goes costs: commbench's run with its spans
recorded (the default, which the step split needs), with `--timeline` on top, and
with recording switched off in this process, in rounds of one job whose order rotates
(each arm goes first, second and third equally often), so neither drift nor position
favours an arm.

    mpiexec -n 2 python benchmarks/timeline_cost.py [--rounds 5] [run flags]

Prints each round and two ratios of total img/sec, as the ratio of medians and as
the median of the paired rounds with the 95% interval of their geometric mean: recorded/off (the always-on split; the target is
that it changes nothing measurable) and timeline/off (the target is >= 0.97).
"""

import dataclasses
import os
import tempfile

import torch.distributed as dist

from commbench import spans
from commbench.config import config_from_args
from commbench.launch.detect import detect_launch
from commbench.launch.distributed import init_distributed
from harness import commbench_rate, parser, ratio, report_rounds


def unrecorded(config):
    """A run whose recorder takes nothing (the loop and the steps still call it)."""
    add = spans.Recorder.add
    spans.Recorder.add = lambda self, *args, **kwargs: None
    try:
        return commbench_rate(config)
    finally:
        spans.Recorder.add = add


def main() -> None:
    args = parser(__doc__, model="resnet18", image_size=32, num_iters=5,
                  reference_iters=0, dist_optimizer="neighbor_allreduce",
                  rounds=5).parse_args()
    with tempfile.TemporaryDirectory() as results_dir:
        args.results_dir = results_dir
        config = config_from_args(args)
        ctx = init_distributed(detect_launch(), config.no_cuda, config.timeout)
        shared = [results_dir]  # every rank names rank 0's file (the configs must agree)
        dist.broadcast_object_list(shared, 0)
        arms = {
            "off": lambda round_: unrecorded(config),
            "recorded": lambda round_: commbench_rate(config),
            "timeline": lambda round_: commbench_rate(dataclasses.replace(
                config, timeline=os.path.join(shared[0], f"trace-{round_}.json"))),
        }
        rates = {arm: [] for arm in arms}
        for round_ in range(args.rounds):
            names = list(arms)
            for arm in names[round_ % 3:] + names[:round_ % 3]:
                rates[arm].append(arms[arm](round_))
            report_rounds(rates, ctx.rank)
    if ctx.rank == 0:
        print(f"{config.dist_optimizer}, {config.model} {config.image_size}px batch "
              f"{config.batch_size}, {ctx.world_size} workers:")
        print(f"  recorded/off = {ratio(rates, 'recorded', 'off')}; target: no change")
        print(f"  timeline/off = {ratio(rates, 'timeline', 'off')}; target >= 0.97")


if __name__ == "__main__":
    main()
