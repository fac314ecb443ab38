"""Under mpiexec: every rank gives a small model with BatchNorm its own parameters and
running statistics; commbench.job.accuracy_loop.average_into must give each rank's twin the
mean over ranks of every floating-point entry, and this rank's integer ones. Prints
"OK <rank>" on success."""

import sys

import torch
import torch.distributed as dist

from commbench.job.accuracy_loop import average_into
from commbench.launch.detect import detect_launch
from commbench.launch.distributed import init_distributed, leave_libraries


def small_model():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))


def main() -> int:
    ctx = init_distributed(detect_launch(), no_cuda=True, timeout=60)
    torch.manual_seed(100 + ctx.rank)
    model, twin = small_model(), small_model()
    model.train()
    model(torch.randn(5, 3, 8, 8))  # BatchNorm's running statistics move, differently per rank
    average_into(twin, model, ctx.world_size)
    states = [None] * ctx.world_size
    dist.all_gather_object(states, {k: v.clone() for k, v in model.state_dict().items()})
    bad = []
    for key, value in twin.state_dict().items():
        if value.is_floating_point():
            mean = sum(s[key].double() for s in states) / ctx.world_size
            if not torch.allclose(value.double(), mean, atol=1e-6):
                bad.append(key)
        elif not torch.equal(value, model.state_dict()[key]):
            bad.append(key)
    if len({float(s["1.running_mean"][0]) for s in states}) < ctx.world_size:
        bad.append("ranks' running statistics were meant to differ")
    print(f"BAD {ctx.rank} {bad}" if bad else f"OK {ctx.rank}", flush=True)
    leave_libraries()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
