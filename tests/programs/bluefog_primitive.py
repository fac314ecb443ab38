"""Bluefog's blocking neighbor_allreduce against commbench's NeighborExchange on the
same static topology and the same rank-distinct tensor (run under bfrun):

    bfrun -np N python tests/programs/bluefog_primitive.py [TOPOLOGY]

Rank 0 prints `PRIMITIVE <json>`: per rank, the largest relative difference.
"""

import sys

import torch
from commbench.launch.distributed import init_distributed
from commbench.launch.detect import detect_launch
from commbench.optimizers.bluefog import _graph
from commbench.comm.neighbor_exchange import NeighborExchange
from commbench.topology import build_schedule
from gathered import print_everyones


def main() -> None:
    import bluefog.torch as bf

    topology = sys.argv[1] if len(sys.argv) > 1 else "exponential-2"
    ctx = init_distributed(detect_launch(), True, 60)
    bf.init()
    schedule = build_schedule(topology, ctx.world_size, dynamic=False)
    assert bf.set_topology(_graph(schedule.at(0).weights), is_weighted=True)
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(ctx.rank))
    theirs = bf.neighbor_allreduce(x.clone(), name="x")
    ours = x.clone()
    NeighborExchange([ours], schedule, ctx.rank)()
    mine = float((ours - theirs).abs().max() / x.abs().max())
    print_everyones("PRIMITIVE", mine, ctx)


if __name__ == "__main__":
    main()
