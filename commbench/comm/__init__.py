"""The communication mechanism the strategies are built from: how bytes move
(transport), the neighbor-averaging engine (neighbor_exchange), averaging inside and
between machines (machine_averaging), a machine's buffers in shared memory
(shared_memory), MPI's allreduce for DDP's buckets (mpi_averager), models'
parameters as flat buffers (fused), and the collectives a plugin calls, counted
(collectives)."""
