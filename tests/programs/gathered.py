"""What the test programs end with: every rank's finding gathered, rank 0 printing them
on one line the test reads (`TAG <json list, one per rank>`), then the libraries left."""

import json

import torch.distributed as dist

from commbench.launch.distributed import leave_libraries


def print_everyones(tag: str, mine, ctx) -> None:
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    if ctx.rank == 0:
        print(f"{tag} " + json.dumps(everyone), flush=True)
    leave_libraries()
