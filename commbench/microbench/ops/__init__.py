"""The ops of `commbench microbench`, one file each, nccl-tests style: the code path
the plugin of the same name runs in training, and the raw primitives that do the same
exchange with no commbench code (the harness, commbench.microbench.harness, times them
side by side)."""

from commbench.microbench.ops.allreduce import Allreduce
from commbench.microbench.ops.hierarchical_neighbor_allreduce import HierarchicalNeighborAllreduce
from commbench.microbench.ops.horovod import Horovod
from commbench.microbench.ops.local_sgd import LocalSgd
from commbench.microbench.ops.neighbor_allreduce import NeighborAllreduce

OPS = {op.name: op for op in (Allreduce, NeighborAllreduce, HierarchicalNeighborAllreduce,
                              Horovod, LocalSgd)}
