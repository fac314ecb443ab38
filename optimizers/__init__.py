"""Distributed-optimizer plugins: one module per communication strategy, all of the
shape defined in `commbench.optimizers.base`."""
