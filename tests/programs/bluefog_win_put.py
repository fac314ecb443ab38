"""Bluefog's one-sided averaging as commbench runs it (`bluefog.win_put`), with no local
update (learning rate 0), on a static graph (run under bfrun):

    bfrun -np N python tests/programs/bluefog_win_put.py MODE [TOPOLOGY] [STEPS]

- lockstep: the windows the plugin made, driven in rounds (every rank puts, all meet,
  every rank averages its window): commbench's W handed to Bluefog must bring every rank
  to the average of all ranks' first parameters;
- steps: the plugin's own training steps, whose puts land while their targets run on:
  every rank must come to one value (a step may average a neighbor's previous put, so
  that value is near the first average, not at it).

Rank 0 prints `WINPUT <json>`: per rank, the largest distance of a parameter from the
first average before and after, and from the ranks' mean after.
"""

import sys

import torch
import torch.distributed as dist

from commbench import registry
from commbench.config.run_config import RunConfig
from commbench.launch.detect import detect_launch
from commbench.launch.distributed import init_distributed
from gathered import print_everyones


def mean(tensors, world_size):
    found = [t.detach().clone() for t in tensors]
    for t in found:
        dist.all_reduce(t)
        t /= world_size
    return found


def main() -> None:
    mode = sys.argv[1]
    topology = sys.argv[2] if len(sys.argv) > 2 else "exponential-2"
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    ctx = init_distributed(detect_launch(), True, 60)
    config = RunConfig(dist_optimizer="bluefog.win_put", topology=topology,
                       disable_dynamic_topology=True)
    strategy = registry.resolve("bluefog.win_put")(ctx, config)
    torch.manual_seed(ctx.rank)  # each rank its own first parameters
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))  # Bluefog names leaves by parent
    average = mean(model.parameters(), ctx.world_size)

    def distance(to) -> float:
        return max(float((p.detach() - a).abs().max()) for p, a in zip(model.parameters(), to))

    before = distance(average)
    step = strategy.wrap(model, torch.optim.SGD(model.parameters(), lr=0.0))
    if mode == "lockstep":
        import bluefog.torch as bf

        names = [f"0.{name}" for name, _ in model[0].named_parameters()]
        for _ in range(steps):
            for name, p in zip(names, model.parameters()):
                bf.win_put(p.data, name)
            bf.barrier()
            with torch.no_grad():
                for name, p in zip(names, model.parameters()):
                    p.set_(bf.win_update(name))
            bf.barrier()
    else:
        images, labels = torch.randn(4, 8), torch.arange(4)
        for _ in range(steps):
            step(images, labels)
        strategy.settle()
    mine = {"before": before, "after": distance(average),
            "spread": distance(mean(model.parameters(), ctx.world_size))}
    print_everyones("WINPUT", mine, ctx)


if __name__ == "__main__":
    main()
