"""`commbench simulate`: project measured runs to other worker counts, links and machine
sizes with a cost model of each strategy's real schedule. A projection is a model's
output, never a measurement: it is labelled, drawn dashed and stored as its own kind.

network   links (latency α, seconds per byte β) per class, stated or fitted
compute   the model's step: phase times, gradient layout, per-batch time samples
costs     the communication of each strategy per step, in closed form
step      one training step of each strategy on a timeline (overlap as scheduled)
command   the subcommand: table, chart and projection file
"""
