"""A strategy as a projection configures it: its name, and the settings of its own
that change its step (topology and schedule, the engine's defaults, the period of
local steps, compression), with the label tables and charts show it by."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

from commbench.config import compression
from commbench.simulate import engines

STRATEGIES = ("allreduce", "horovod", "gradient_allreduce", "neighbor_allreduce",
              "hierarchical_neighbor_allreduce", "bluefog.neighbor_allreduce",
              "bluefog.hierarchical_neighbor_allreduce", "local_sgd", "diloco", "none")
NEIGHBOR = ("neighbor_allreduce", "hierarchical_neighbor_allreduce")
PERIODIC = ("local_sgd", "diloco")


@dataclass(frozen=True)
class Strategy:
    """A strategy as configured: decentralized ones by topology and schedule."""

    name: str
    topology: str = "exponential-2"
    dynamic: bool = True
    atc: bool = False
    hierarchical_allreduce: bool = False  # horovod's --hierarchical-allreduce
    horovod_version: str = engines.HOROVOD_DEFAULT  # whose defaults horovod runs with
    every: Tuple[int, ...] = (8,)  # local_sgd's and diloco's --average-every: H or h1, h2
    outer_bf16: bool = False  # diloco's --outer-dtype bf16
    powersgd: Tuple[int, float] = ()  # allreduce's --compression powersgd: (rank, min_rate)
    whole_steps: int = 0  # PowerSGD's first steps, sent uncompressed (start_powerSGD_iter)
    narrow: str = ""  # --compression fp16 or bf16 (--fp16-allreduce): 2-byte messages

    @property
    def bytes_per_element(self) -> Optional[float]:
        """What its messages carry per gradient or parameter element; None: as the
        projection's inputs say."""
        return 2.0 if self.narrow else None

    def uncompressed(self) -> "Strategy":
        """The strategy as it runs before PowerSGD starts: its first whole_steps."""
        return replace(self, powersgd=(), whole_steps=0)

    @property
    def base(self) -> str:
        """The strategy without its engine: bluefog.neighbor_allreduce -> neighbor_allreduce."""
        return self.name.rpartition(".")[2]

    def engine(self) -> engines.Engine:
        if self.name == "horovod":
            return engines.horovod(self.horovod_version)
        return engines.BLUEFOG if self.name.startswith("bluefog.") else engines.DDP

    def label(self) -> str:
        plain = self._label()
        if not self.narrow:
            return plain
        return f"{plain[:-1]}, {self.narrow})" if plain.endswith(")") else \
            f"{plain} ({self.narrow})"

    def _label(self) -> str:
        if self.name == "horovod":
            settings = (["hierarchical allreduce"] if self.hierarchical_allreduce else []) + (
                [] if self.horovod_version == engines.HOROVOD_DEFAULT
                else [f"{engines.horovod(self.horovod_version).version} defaults"])
            return f"horovod ({', '.join(settings)})" if settings else "horovod"
        if self.name in PERIODIC:
            every = ",".join(map(str, self.every))
            return f"{self.name} (H={every}{', bf16' if self.outer_bf16 else ''})"
        if self.powersgd:
            rank, min_rate = self.powersgd
            sent = compression.Compression("powersgd", rank,
                                           self.whole_steps or compression.POWERSGD_START,
                                           min_rate)
            return f"{self.name} ({sent})"
        if self.base not in NEIGHBOR:
            return self.name
        settings = [self.topology, "dynamic" if self.dynamic else "static"]
        if self.atc:
            settings.append("ATC")
        return f"{self.name} ({', '.join(settings)})"
