"""What a strategy's messages travel as: `--compression`.

- `fp16`, `bf16`: each message travels in the narrow type. `allreduce` uses DDP's
  `fp16_compress_hook` / `bf16_compress_hook` (gradients cast, divided, summed, cast
  back); the neighbor strategies send narrow copies of the parameters and combine them
  in full precision, each worker's own copy never rounded.
- `powersgd:RANK[,start=N][,min_rate=X]`: torch's PowerSGD hook for `allreduce` (each
  gradient matrix sent as a rank-RANK product P Q^T, error feedback and warm start on).
  `start` is torch's `start_powerSGD_iter`: plain allreduce before that step (default
  2, the earliest torch allows with error feedback); `min_rate` its
  `min_compression_rate`: a matrix whose approximation would not shrink it at least that
  many times is sent whole (default 2, torch's).

`--fp16-allreduce`, Horovod's spelling, is `--compression fp16`. A strategy lists the
kinds it takes (`Strategy.compressions`); any other is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from commbench.errors import UsageError
from commbench.config.flags import accepting, flag
from commbench.config.sections import Section

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from commbench.config.run_config import RunConfig

KINDS = ("none", "fp16", "bf16", "powersgd")
NARROW = ("fp16", "bf16")
POWERSGD_START = 2
POWERSGD_MIN_RATE = 2.0


@dataclass(frozen=True)
class Compression:
    kind: str = "none"
    rank: int = 0  # powersgd: torch's matrix_approximation_rank
    start: int = POWERSGD_START  # powersgd: torch's start_powerSGD_iter
    min_rate: float = POWERSGD_MIN_RATE  # powersgd: torch's min_compression_rate

    def __str__(self) -> str:
        if self.kind != "powersgd":
            return self.kind
        text = f"powersgd:{self.rank}"
        if self.start != POWERSGD_START:
            text += f",start={self.start}"
        if self.min_rate != POWERSGD_MIN_RATE:
            text += f",min_rate={self.min_rate:g}"
        return text

    @property
    def on(self) -> bool:
        return self.kind != "none"

    @property
    def wire_fraction(self) -> Optional[float]:
        """Bytes sent per float32 byte of payload (None: PowerSGD's depends on the shapes)."""
        return {"none": 1.0, "fp16": 0.5, "bf16": 0.5}.get(self.kind)

    @property
    def unit_roundoff(self) -> float:
        """The relative rounding of one cast to the wire type (float32's where none)."""
        return {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}.get(self.kind, 2.0 ** -24)

    def wire_dtype(self) -> Optional["torch.dtype"]:
        """The narrow type messages travel in (None: their own)."""
        import torch

        return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.kind)


def parse(text: str) -> Compression:
    """A Compression from its text; ValueError for anything else."""
    kind, _, rest = text.strip().partition(":")
    if kind in ("none", *NARROW) and not rest:
        return Compression(kind)
    if kind != "powersgd" or not rest:
        raise ValueError
    rank_text, *settings = rest.split(",")
    rank = int(rank_text)
    if rank < 1:
        raise ValueError
    values = {}
    for setting in settings:
        name, equals, value = setting.partition("=")
        if not equals or name not in ("start", "min_rate") or name in values:
            raise ValueError
        values[name] = value
    start = int(values.get("start", POWERSGD_START))
    min_rate = float(values.get("min_rate", POWERSGD_MIN_RATE))
    if start < POWERSGD_START or not min_rate > 0:
        raise ValueError
    return Compression("powersgd", rank, start, min_rate)


@accepting("none, fp16, bf16 or powersgd:RANK[,start=N][,min_rate=X] (RANK >= 1, "
           f"N >= {POWERSGD_START}, X > 0)")
def spec(text: str) -> str:
    """The flag's check: the text written the one way results record it."""
    return str(parse(text))


@dataclass(frozen=True)
class CompressionFlags(Section):
    title = "compression (strategies that compress their messages)"
    ignored_because = ("compresses nothing; leave it out (`commbench list` says which "
                       "strategies compress what)")

    compression: str = flag(
        "none", "what the strategy's messages travel as: none, fp16, bf16, or (allreduce) "
        "powersgd:RANK[,start=N][,min_rate=X], torch's PowerSGD; `commbench list` says which "
        "strategy takes which (commbench.config.compression)", spec, "KIND")
    fp16_allreduce: bool = flag(False, "compress communicated tensors to float16 (Horovod's "
                                "spelling of --compression fp16)")


def of(config: "RunConfig") -> Compression:
    """The run's compression: --compression, or fp16 for --fp16-allreduce."""
    chosen = parse(config.compression)
    if config.fp16_allreduce:
        if chosen.kind not in ("none", "fp16"):
            raise UsageError(f"argument --compression: {chosen} and --fp16-allreduce (Horovod's "
                             "spelling of --compression fp16) ask for different things; "
                             "give one")
        return Compression("fp16")
    return chosen


def check(config: "RunConfig", strategy: str, takes: Sequence[str]) -> None:
    """UsageError when the strategy cannot send what the run asks for."""
    chosen = of(config)
    if chosen.on and chosen.kind not in takes:
        offered = ", ".join(k if k != "powersgd" else "powersgd:RANK" for k in takes)
        raise UsageError(f"argument --compression: {strategy} cannot send {chosen.kind}; it "
                         f"takes {offered}")


def backend_sums_bfloat16(device) -> bool:
    """Whether the process group's backend can allreduce bfloat16 (torch 1.10's gloo
    cannot). A collective: every rank asks, and every rank gets the same answer."""
    import torch
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.zeros(1, dtype=torch.bfloat16, device=device))
    except RuntimeError:
        return False
    return True


def refuse_unsummable(chosen: Compression, device, backend: str, flag: str) -> None:
    """UsageError, on every rank alike, where the backend cannot sum the narrow type."""
    import torch

    if chosen.kind == "bf16" and not backend_sums_bfloat16(device):
        raise UsageError(f"argument {flag}: this torch's {backend} (torch {torch.__version__}) "
                         "cannot sum bfloat16; use fp16, or none")


def compresses(shape, rank: int, min_rate: float) -> bool:
    """Whether torch's PowerSGD sends a gradient of this shape as P Q^T at this rank (it
    views it as shape[0] rows, caps the rank at the smaller side, and compresses only
    what shrinks more than min_rate times)."""
    rows = shape[0] if len(shape) else 1
    cols = 1
    for side in shape[1:]:
        cols *= side
    rank = min(rows, cols, rank)
    return (rows + cols) * rank * min_rate < rows * cols


def refuse_useless_rank(chosen: Compression, model, name: str) -> None:
    """UsageError where PowerSGD at this rank would send every layer whole."""
    shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
    if any(compresses(shape, chosen.rank, chosen.min_rate) for shape in shapes):
        return
    usable = [r for r in range(1, chosen.rank)
              if any(compresses(shape, r, chosen.min_rate) for shape in shapes)]
    hint = (f"use {Compression('powersgd', usable[-1], chosen.start, chosen.min_rate)} or "
            "a lower rank" if usable else "no rank compresses it")
    raise UsageError(f"argument --compression: {chosen} compresses no layer of {name} (each "
                     f"would shrink less than min_rate={chosen.min_rate:g} times); {hint}")


def powersgd_facts(state) -> Dict[str, Any]:
    """What a result records of PowerSGD: torch's compression_stats, over the buckets it
    compressed so far (numbers of elements before and after, and their ratio)."""
    if state is None or not state.total_numel_before_compression:
        return {}
    rate, before, after = state.compression_stats()
    return {"powersgd": {"compression_rate": float(rate), "numel_before": int(before),
                         "numel_after": int(after), "rank": state.matrix_approximation_rank,
                         "start_powerSGD_iter": state.start_powerSGD_iter,
                         "min_compression_rate": state.min_compression_rate}}
