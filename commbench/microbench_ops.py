"""The ops of `commbench microbench`: the code paths the plugins run in training, each
one unit of the same shape, nccl-tests style (the harness in commbench.microbench
times them; the raw primitives they are compared with are in commbench.microbench_raw).

  allreduce                        one flat bucket of S bytes averaged as the
                                   plugin's DDP comm hook does (divide by n, then
                                   all_reduce: torch.distributed's, or MPI's on CPU
                                   under an MPI launcher, per --cpu-transport). Not
                                   DDP itself: its reducer needs a model and a
                                   backward pass, and would time those too.
  neighbor_allreduce               NeighborExchange.start()/finish() on the flat
                                   buffer the plugin fuses a model into (built by the
                                   plugin's own wrap(), schedule from --topology)
  hierarchical_neighbor_allreduce  the plugin's MachineAveraging (AWC, its default)
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from commbench import microbench_raw

ELEMENT_BYTES = 4  # float32


class Data:
    """Rank-distinct data X_r = c_r base + d_r with c_r = r + 1, d_r = r²: base varies
    along the buffer (a chunk delivered to the wrong place shows), c_r and d_r along
    the ranks (a message from the wrong peer shows). All values are exact in float32."""

    def __init__(self, ctx, count: int):
        import torch

        self.count, self.nbytes = count, count * ELEMENT_BYTES
        index = torch.arange(count, dtype=torch.float32, device=ctx.device)
        self.base = 1.0 + torch.remainder(index, 97.0) / 128.0
        self.c = [float(r + 1) for r in range(ctx.world_size)]
        self.d = [float(r * r) for r in range(ctx.world_size)]
        self.pristine = self.c[ctx.rank] * self.base + self.d[ctx.rank]

    def fresh(self):
        """A new buffer holding this rank's X_r."""
        return self.pristine.clone()

    def copy_in(self, buffer):
        """reset() of a contender that changes its buffer: X_r back in, untimed."""
        return lambda: buffer.copy_(self.pristine)

    def is_right(self, out, weights: Sequence[float]) -> bool:
        """Whether out holds sum_j weights[j] X_j (the dense reference (W_t X)_r)."""
        a = sum(w * self.c[j] for j, w in enumerate(weights))
        b = sum(w * self.d[j] for j, w in enumerate(weights))
        expected = self.base * a + b
        error = float((out - expected).abs().max()) if self.count else 0.0
        return error <= 1e-5 * (1.0 + abs(a) * 1.8 + abs(b))


class Op:
    """One op at one size on this rank, built from its plugin class. Every op has:

    name               the --op name (and the plugin's)
    buffer             the tensor run() leaves its output in
    run()              one call of the commbench code path, as training runs it
    traffic(call)      closed form of the (bytes sent, bytes received) by this rank
    reference(call)    weights w of this rank's correct output, sum_j w[j] X_j
    bandwidths(algbw)  its bandwidth figures besides algbw (commbench.metrics)
    raw()              the raw primitives doing the same exchange (Primitive list)
    """

    name = ""

    def __init__(self, plugin_cls, ctx, config, data: Data):
        self.ctx, self.data = ctx, data
        self.n, self.rank, self.S = ctx.world_size, ctx.rank, data.nbytes


class Allreduce(Op):
    name = "allreduce"

    def __init__(self, plugin_cls, ctx, config, data: Data):
        super().__init__(plugin_cls, ctx, config, data)
        self.buffer = data.fresh()
        self.plugin = plugin_cls(ctx, config)

    def run(self) -> None:  # the plugin's comm hook on one bucket: divide, then sum
        self.plugin.average(self.buffer)

    def traffic(self, call: int) -> Tuple[float, float]:
        from commbench import metrics

        ring = metrics.ring_allreduce_bytes(self.S, self.n)
        return ring, ring

    def reference(self, call: int) -> List[float]:
        return [1.0 / self.n] * self.n

    def bandwidths(self, algbw: float) -> Dict[str, float]:
        from commbench import metrics

        return {"busbw": algbw * metrics.allreduce_bus_factor(self.n)}

    def raw(self) -> List[microbench_raw.Primitive]:
        return microbench_raw.allreduce(self.ctx, self.data)


class Mixing(Op):
    """A parameter-averaging plugin, wrapped around a model whose parameters are one
    flat buffer of `count` elements, exactly as in training."""

    def __init__(self, plugin_cls, ctx, config, data: Data):
        import torch

        super().__init__(plugin_cls, ctx, config, data)
        model = torch.nn.Module()
        model.weight = torch.nn.Parameter(data.fresh())
        plugin = plugin_cls(ctx, config)
        plugin.wrap(model, torch.optim.SGD(model.parameters(), lr=0.0))
        self.buffer = model.weight.data
        self.mixer, self.schedule = plugin.mixer, plugin.schedule

    def run(self) -> None:  # one averaging step, as the training step runs it
        self.mixer.start()
        self.mixer.finish()

    def bandwidths(self, algbw: float) -> Dict[str, float]:
        return {"link_bw": algbw}  # links run concurrently, each carries S


class NeighborAllreduce(Mixing):
    name = "neighbor_allreduce"

    def traffic(self, call: int) -> Tuple[float, float]:
        plan = self.mixer.plan(call)
        return len(plan.destinations) * self.S, len(plan.sources) * self.S

    def reference(self, call: int) -> Sequence[float]:
        return self.schedule.at(call).weights[self.rank]

    def raw(self) -> List[microbench_raw.Primitive]:
        return microbench_raw.neighbor(self.ctx, self.data, self.mixer.plan, self.schedule)


class HierarchicalNeighborAllreduce(Mixing):
    name = "hierarchical_neighbor_allreduce"

    def __init__(self, plugin_cls, ctx, config, data: Data):
        super().__init__(plugin_cls, ctx, config, data)
        self.L = ctx.machine_size
        self.machine, self.leader = self.rank // self.L, self.rank // self.L * self.L
        # The leader's exchange with neighbor machines (None on other ranks); machines
        # of one rank: the plugin is plain neighbor averaging.
        self.exchange = getattr(self.mixer, "exchange", None) if self.L > 1 else self.mixer

    def traffic(self, call: int) -> Tuple[float, float]:
        """Nominal bytes: ring allreduce inside the machine, the leader's exchange
        with neighbor machines, a flat broadcast from the leader."""
        from commbench import metrics

        S, L, t = self.S, self.L, self.schedule.at(call)
        inside = metrics.ring_allreduce_bytes(S, L) if L > 1 else 0.0
        sent, received = inside, inside
        if self.rank == self.leader:
            sent += len(t.out_neighbors(self.machine)) * S + (L - 1) * S
            received += len(t.in_neighbors(self.machine)) * S
        else:
            received += S
        return sent, received

    def reference(self, call: int) -> Any:
        import numpy as np

        # The row of W_M kron J_L/L
        return np.repeat(self.schedule.at(call).weights[self.machine], self.L) / self.L

    def raw(self) -> List[microbench_raw.Primitive]:
        if self.L == 1:
            return microbench_raw.neighbor(self.ctx, self.data, self.exchange.plan, self.schedule)
        return [microbench_raw.composite(self.data, self.exchange, self.mixer.group, self.leader)]


OPS = {op.name: op for op in (Allreduce, NeighborAllreduce, HierarchicalNeighborAllreduce)}
