"""The ops of `commbench microbench`, one file each, nccl-tests style: the code path
the plugin of the same name runs in training, and the raw primitives that do the same
exchange with no commbench code (the harness, commbench.microbench.harness, times them
side by side).

A plugin adds an op as it adds a strategy: an entry point in the group GROUP, named as
the strategy whose exchange it times, naming a commbench.microbench.ops.base.Op
(docs/plugins.md). An op of a name already taken is an error, in one line.
"""

from typing import Dict, List, Type, Union

from commbench import registry
from commbench.errors import UsageError
from commbench.microbench.ops.allreduce import Allreduce
from commbench.microbench.ops.base import Op
from commbench.microbench.ops.hierarchical_neighbor_allreduce import HierarchicalNeighborAllreduce
from commbench.microbench.ops.horovod import Horovod
from commbench.microbench.ops.local_sgd import LocalSgd
from commbench.microbench.ops.neighbor_allreduce import NeighborAllreduce

GROUP = "commbench.microbench_ops"
# commbench's own
OPS = {op.name: op for op in (Allreduce, NeighborAllreduce, HierarchicalNeighborAllreduce,
                              Horovod, LocalSgd)}


def every_op() -> Dict[str, Union[Type[Op], registry.PluginEntry]]:
    """commbench's ops, then the installed plugins', by name (a plugin's not yet loaded)."""
    plugins = registry.discover(GROUP)
    taken = sorted(OPS.keys() & plugins.keys())
    if taken:
        plugin = plugins[taken[0]]
        raise UsageError(f"two microbench ops are named {plugin.name!r}: commbench's and "
                         f"{plugin.target} ({plugin.source})")
    return {**OPS, **plugins}


def names() -> List[str]:
    """The --op names: every op, installed plugins' included."""
    return list(every_op())


def find(name: str) -> Type[Op]:
    """The op class of an --op name (names() holds it)."""
    found = every_op()[name]
    if isinstance(found, registry.PluginEntry):
        found = found.load()
        if not (isinstance(found, type) and issubclass(found, Op)):
            raise UsageError(f"microbench op {name!r} is not a "
                             "commbench.microbench.ops.base.Op")
    return found
