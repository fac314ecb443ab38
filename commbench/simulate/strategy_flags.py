"""The strategy flags of `commbench simulate`, held to `commbench run`'s own rules: a flag
that would change no projected row is refused in one line, and no strategy is projected
with a setting that `run` refuses for it (each plugin's check_flags, the registry's
refuse_unread), rather than projected without it under a title that names it.

The strategies projected are those named with --dist-optimizer, else the runs' (as
they ran: the flags that set a strategy up then change nothing), else the defaults.
"""

from __future__ import annotations

from typing import List, Sequence

from commbench import registry
from commbench.config.run_config import RunConfig
from commbench.errors import UsageError
from commbench.config.flags import option_name
from commbench.config.compression import CompressionFlags
from commbench.config.sections import refuse_unread
from commbench.optimizers.local_sgd import AVERAGE_EVERY
from commbench.simulate.calibrate import strategy_of
from commbench.topology.schedules import TopologyFlags

DEFAULT_STRATEGIES = ("allreduce", "neighbor_allreduce", "hierarchical_neighbor_allreduce")
# The flags that set up the strategies named with --dist-optimizer only.
NAMED_ONLY = ("average_every", "compression", "hierarchical_allreduce", "horovod_version")
TOPOLOGY_FLAGS = TopologyFlags.names()
WHOSE = "strategy of this projection"
SEND_NOTHING = ("none",)  # the compute-only reference: no message to make narrower


def refuse_what_changes_nothing(args, runs: Sequence[dict]) -> None:
    """UsageError for a flag no projected strategy reads, or a setting one of them cannot
    run with. runs: the documents of the runs projected (their strategies are, without
    --dist-optimizer); a name simulate has no cost model for is left for its own error."""
    run_strategies = [s.name for s in map(strategy_of, runs) if s]
    names = [s.strip() for s in (args.dist_optimizer or "").split(",") if s.strip()]
    if not names:
        _refuse_settings_of_strategies_not_named(args, bool(run_strategies))
        names = list(dict.fromkeys(run_strategies)) or list(DEFAULT_STRATEGIES)
    config = RunConfig(
        topology=args.topology, disable_dynamic_topology=args.disable_dynamic_topology,
        atc_style=args.atc_style, compression=args.compression or "none",
        fp16_allreduce=args.fp16_allreduce,
        options={"average_every": args.average_every,
                 "hierarchical_allreduce": args.hierarchical_allreduce})
    registry.refuse_unread(names, config, WHOSE)
    if args.horovod_version is not None and "horovod" not in names:
        raise UsageError(f"argument --horovod-version: means nothing to any {WHOSE} "
                         f"({', '.join(names)}); only horovod reads it")
    for cls in _plugins(names):
        cls.check_flags(config)
        # A projection sends every strategy's messages as --compression says (and labels
        # each so); --fp16-allreduce halves the bytes of those that send any.
        among = ("compression",) if cls.name in SEND_NOTHING else CompressionFlags.names()
        refuse_unread(config, {k: v for k, v in cls.unread(config).items() if k in among})


def _refuse_settings_of_strategies_not_named(args, from_runs: bool) -> None:
    """Without --dist-optimizer, the strategies' own settings come from their runs (or,
    without runs, the topology flags set the default strategies up)."""
    given = [n for n in NAMED_ONLY if getattr(args, n) not in (None, False, AVERAGE_EVERY)]
    if from_runs:
        given += [n for n in TOPOLOGY_FLAGS if getattr(args, n) != _default(n)]
    if given:
        source = "the runs' strategies as they ran" if from_runs else \
            f"the default strategies ({', '.join(DEFAULT_STRATEGIES)})"
        raise UsageError(f"argument {option_name(given[0])}: sets up the strategies named "
                         f"with --dist-optimizer; without it the projection shows {source}; "
                         "name them, or leave it out")


def _default(name: str):
    return RunConfig.__dataclass_fields__[name].default


def _plugins(names: Sequence[str]) -> List[type]:
    found = []
    for name in names:
        try:
            found.append(registry.resolve(name))
        except UsageError:
            continue
    return found
