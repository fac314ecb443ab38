"""What every microbench op is made of: the rank-distinct data it starts from, the
shape of an op, and the shape of a raw primitive (one contender of no commbench code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, NamedTuple, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from commbench.optimizers.mixing import MixingStrategy

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

    def is_right(self, out, weights: Sequence[float], tolerance: float = 1e-5) -> bool:
        """Whether out holds sum_j weights[j] X_j (the dense reference (W_t X)_r), within
        `tolerance` of the largest value it can hold."""
        a = sum(w * self.c[j] for j, w in enumerate(weights))
        b = sum(w * self.d[j] for j, w in enumerate(weights))
        expected = self.base * a + b
        error = float((out - expected).abs().max()) if self.count else 0.0
        return error <= tolerance * (1.0 + abs(a) * 1.8 + abs(b))


class Op:
    """One op at one size on this rank, built from its plugin class. Every op has:

    name               the --op name (and the plugin's)
    buffer             the tensor run() leaves its output in
    run()              one call of the commbench code path, as training runs it
    traffic(call)      closed form of the (bytes sent, bytes received) by this rank
    reference(call)    weights w of this rank's correct output, sum_j w[j] X_j
    tolerance          how far from it the output may be (a narrow wire type rounds)
    wire_fraction      bytes sent per byte of the float32 payload (--compression)
    bandwidths(algbw)  its bandwidth figures besides algbw (commbench.result.metrics)
    raw()              the raw primitives doing the same exchange (Primitive list)

    traffic and the bandwidths count the float32 payload; what a contender actually
    sent is that times its wire fraction."""

    name = ""
    compresses = True  # whether --compression narrows what its commbench row sends

    def __init__(self, plugin_cls, ctx, config, data: Data):
        from commbench.config import compression

        self.ctx, self.data = ctx, data
        self.n, self.rank, self.S = ctx.world_size, ctx.rank, data.nbytes
        self.codec = compression.of(config)
        self.wire_fraction = self.codec.wire_fraction
        # a cast each way and a rounding per summand, each of the wire type's unit
        self.tolerance = max(1e-5, (self.n + 2) * self.codec.unit_roundoff)

    def transport(self) -> Optional[str]:
        """What carries commbench's call at this size (None: the engine decides)."""
        return None


class Primitive(NamedTuple):
    """One raw contender: run() is timed, reset() runs before it, untimed; it sends
    wire_fraction of the op's float32 traffic."""

    impl: str
    run: Callable[[], None]
    reset: Callable[[], None]
    wire_fraction: float = 1.0


def no_reset() -> None:  # the payload is only read
    pass


def on_mpi_cpu(ctx) -> bool:
    """mpi4py reads and writes the tensors' memory: CPU tensors under an MPI launcher."""
    return bool(ctx.launch.mpi) and ctx.device.type == "cpu"


class MixingOp(Op):
    """A parameter-averaging plugin, wrapped around a model whose parameters are one
    flat buffer of `count` elements, exactly as in training."""

    def __init__(self, plugin_cls, ctx, config, data: Data):
        import torch

        super().__init__(plugin_cls, ctx, config, data)
        model = torch.nn.Module()
        model.weight = torch.nn.Parameter(data.fresh())
        plugin: "MixingStrategy" = plugin_cls(ctx, config)
        plugin.wrap(model, torch.optim.SGD(model.parameters(), lr=0.0))
        self.buffer = model.weight.data
        self.plugin, self.mixer, self.schedule = plugin, plugin.mixer, plugin.schedule

    def run(self) -> None:  # one averaging step, as the training step runs it
        self.mixer.start()
        self.mixer.finish()

    def transport(self) -> Optional[str]:
        """The exchange's: for the hierarchical strategy the one between machines
        (inside a machine torch.distributed carries the rest)."""
        return self.plugin.transport_for([self.buffer])

    def bandwidths(self, algbw: float) -> Dict[str, float]:
        return {"link_bw": algbw}  # links run concurrently, each carries S
