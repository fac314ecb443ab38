"""Who averages with whom: the mixing matrices behind decentralized strategies.

`neighbor_allreduce` and `hierarchical_neighbor_allreduce` replace each worker's
parameters by a weighted average of its own and its in-neighbors'. This package
builds those weights, as static graphs (`build_topology`) and as per-step dynamic
schedules (`build_schedule`), and says how fast each one mixes (`spectral_gap`).

Convention: W[i, j] is the weight receiver i gives to worker j's value, so one
averaging step is x' = W @ x. Row i off the diagonal lists i's in-neighbors,
column j lists j's out-neighbors. Bluefog's networkx graphs store the transpose
(edge j -> i carries W[i, j]). In a circulant graph with shift set S, worker i
receives from i - k and sends to i + k (mod n) for every k in S.
"""

from commbench.topology.graphs import (DEFAULT_TOPOLOGY, TOPOLOGY_NAMES, Topology,
                                       TopologyError, TopologyInfo, build_topology, describe,
                                       mesh_shape)
from commbench.topology.schedules import Schedule, build_schedule

__all__ = ["DEFAULT_TOPOLOGY", "TOPOLOGY_NAMES", "Schedule", "Topology", "TopologyError",
           "TopologyInfo", "build_schedule", "build_topology", "describe", "mesh_shape"]
