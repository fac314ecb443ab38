"""A job's start-up on every rank, the same for `commbench run` and `commbench
microbench`: the allocator set, the launcher read, the request checked, the results
directory and the statistics made sure of, then the process group and rank 0's
printer. Every check runs before the process group, so a bad request ends every rank
alike with one line instead of leaving one waiting on a peer that stopped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Tuple, TypeVar

from commbench.result import metrics, store
from commbench.job.allocator import steady_malloc
from commbench.job.console import Printer
from commbench.launch.detect import REJOINING, LaunchInfo, detect_launch

if TYPE_CHECKING:  # pragma: no cover
    from commbench.config.run_config import RunConfig
    from commbench.launch.distributed import DistContext

Checked = TypeVar("Checked")


def start(config: "RunConfig", check: Callable[[LaunchInfo], Checked]
          ) -> Tuple[Checked, "DistContext", Printer]:
    """Start the job: what check(launch) returned (it raises UsageError for a request
    this job cannot run), the process group's context, and the printer of rank 0."""
    steady_malloc()  # first: every measurement of the job in one allocation regime
    launch = detect_launch()
    checked = check(launch)
    store.ensure_writable(config.results_dir)
    # The summary after the job, rank 0's, needs scipy's statistics: loaded now, a
    # failure to load them (its shared objects mapped into a process the engines have
    # grown) cannot lose a finished measurement. The other ranks never load them.
    if launch.rank == 0:
        metrics.load_statistics()

    if launch.launcher == REJOINING:  # a rank gossip starts again joins no group here
        from commbench.faults import gossip_rejoin

        ctx = gossip_rejoin.context(launch, config)
    else:
        from commbench.launch.distributed import init_distributed

        ctx = init_distributed(launch, config.no_cuda, config.timeout, config.machine_size)
    return checked, ctx, Printer(ctx.rank == 0)
