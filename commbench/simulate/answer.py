"""The answer first: at each worker count, which strategy a projection says is fastest,
by how much over the next one, or "too close to call" when the two cannot be told
apart: their bands overlap, or they differ by less than the model's own error on runs
it never saw (docs/simulate.md, "Validation": median errors of 2-8% per strategy)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import List, Optional

from commbench.simulate.project import Row

RESOLUTION = 0.05  # gaps below this are within what the model gets wrong


@dataclass(frozen=True)
class Verdict:
    workers: int
    fastest: Row
    runner_up: Optional[Row]  # None: one strategy only

    @property
    def ratio(self) -> Optional[float]:
        return None if self.runner_up is None else self.fastest.img_sec / self.runner_up.img_sec

    @property
    def called(self) -> bool:
        """Whether the projection can tell the fastest from the next."""
        if self.runner_up is None:
            return True
        apart = self.fastest.low > self.runner_up.high
        return apart and self.ratio >= 1 + RESOLUTION

    def call(self) -> str:
        """"called", or why the projection cannot name a winner."""
        if self.called:
            return "called"
        if self.fastest.low <= self.runner_up.high:
            return "too close to call (bands overlap)"
        return f"too close to call (within {100 * RESOLUTION:.0f}%)"

    def sentence(self) -> str:
        if self.runner_up is None:
            return f"{self.fastest.strategy} (the only strategy projected)"
        if not self.called:
            why = "bands overlap" if self.fastest.low <= self.runner_up.high else \
                f"within {100 * RESOLUTION:.0f}%"
            return (f"too close to call: {self.fastest.strategy} {self.ratio:.2f}x "
                    f"{self.runner_up.strategy} ({why})")
        return f"{self.fastest.strategy}, {self.ratio:.2f}x {self.runner_up.strategy}"


def verdicts(rows: List[Row]) -> List[Verdict]:
    """One verdict per worker count, in the rows' order of worker counts."""
    out = []
    for n in sorted({r.workers for r in rows}):
        ranked = sorted((r for r in rows if r.workers == n), key=lambda r: -r.img_sec)
        out.append(Verdict(n, ranked[0], ranked[1] if len(ranked) > 1 else None))
    return out


def runs_of(verdicts: List[Verdict]) -> str:
    """The verdicts in a line, consecutive worker counts with the same call together:
    "N=1-8 too close to call; N=16-1024 neighbor_allreduce 1.06-1.08x"."""
    def call(v: Verdict):
        return v.fastest.strategy.split(" (")[0] if v.called else None

    parts = []
    for name, same in itertools.groupby((v for v in verdicts if v.runner_up is not None),
                                        key=call):
        same = list(same)
        ns = f"N={same[0].workers}" + (f"-{same[-1].workers}" if len(same) > 1 else "")
        if name is None:
            parts.append(f"{ns} too close to call")
            continue
        low, high = min(v.ratio for v in same), max(v.ratio for v in same)
        ratio = f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"
        parts.append(f"{ns} {name} {ratio}")
    return "; ".join(parts)
