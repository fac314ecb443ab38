"""`commbench simulate`: project measured runs to other worker counts, links and machine
sizes with a cost model of each strategy's real schedule. A projection is a model's
output, never a measurement: it is labelled, drawn dashed and stored as its own kind.

link_costs       links (latency α, seconds per byte β) per class, and networks of them
network_inputs   the network from what the user gave: stated links, microbench fits, nccl-tests
compute          the model's step: phase times, gradient layout, per-batch time samples
language         a language model's input size, unit and gradient layout; what it refuses
costs            the communication of each strategy per step, in closed form
engines          Horovod's and Bluefog's cycles, fusion and negotiation, as their code has them
step             one training step of each strategy on a timeline (overlap as scheduled)
project          the projection: img/sec, efficiency and its band per strategy and N
calibrate        links fitted from microbench files or flags; compute and more from runs
table            the printed table and its notes
projection_file  the projection file: written, read back, found for report and plot
command          the subcommand: its flags, then calibrate, project, print, store, chart
"""
