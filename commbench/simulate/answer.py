"""The answer first: at each worker count, which strategy a projection says is fastest,
by how much over the next one, or "too close to call" when the two cannot be told
apart: their bands overlap, or they differ by less than the model's own error on runs
it never saw (docs/simulate.md, "Validation": median errors of 2-8% per strategy)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import List, Optional, Tuple

from commbench.simulate.project import Row

RESOLUTION = 0.05  # gaps below this are within what the model gets wrong


@dataclass(frozen=True)
class Verdict:
    workers: int
    fastest: Row
    runner_up: Optional[Row]  # None: one strategy only
    rest: Tuple[Row, ...] = ()  # the others, fastest first

    @staticmethod
    def apart(faster: Row, slower: Row) -> bool:
        return faster.low > slower.high and faster.img_sec >= (1 + RESOLUTION) * slower.img_sec

    @property
    def third(self) -> Optional[Row]:
        return self.rest[0] if self.rest else None

    @property
    def both_ahead(self) -> bool:
        """Where the first two are too close to call: whether each is called ahead of
        every other strategy (the answer is then "either of the two")."""
        return bool(self.rest) and all(self.apart(leader, other)
                                       for leader in (self.fastest, self.runner_up)
                                       for other in self.rest)

    @property
    def lead(self) -> float:
        """How far the slower of the first two is ahead of the rest (both_ahead)."""
        return self.runner_up.img_sec / self.third.img_sec

    def _closeness(self) -> str:
        return "bands overlap" if self.fastest.low <= self.runner_up.high else \
            f"within {100 * RESOLUTION:.0f}%"

    @property
    def ratio(self) -> Optional[float]:
        return None if self.runner_up is None else self.fastest.img_sec / self.runner_up.img_sec

    @property
    def called(self) -> bool:
        """Whether the projection can tell the fastest from the next."""
        return self.runner_up is None or self.apart(self.fastest, self.runner_up)

    def call(self) -> str:
        """"called", or why the projection cannot name a winner."""
        if self.called:
            return "called"
        ahead = f"; both {self.lead:.2f}x {self.third.strategy} or more" \
            if self.both_ahead else ""
        return f"too close to call ({self._closeness()}){ahead}"

    def sentence(self) -> str:
        if self.runner_up is None:
            return f"{self.fastest.strategy} (the only strategy projected)"
        if not self.called:
            ahead = f"; both ahead of {self.third.strategy}, {self.lead:.2f}x or more" \
                if self.both_ahead else ""
            return (f"too close to call: {self.fastest.strategy} {self.ratio:.2f}x "
                    f"{self.runner_up.strategy} ({self._closeness()}){ahead}")
        return f"{self.fastest.strategy}, {self.ratio:.2f}x {self.runner_up.strategy}"


def verdicts(rows: List[Row]) -> List[Verdict]:
    """One verdict per worker count, in the rows' order of worker counts."""
    out = []
    for n in sorted({r.workers for r in rows}):
        ranked = sorted((r for r in rows if r.workers == n), key=lambda r: -r.img_sec)
        out.append(Verdict(n, ranked[0], ranked[1] if len(ranked) > 1 else None,
                           tuple(ranked[2:])))
    return out


def runs_of(verdicts: List[Verdict]) -> str:
    """The verdicts in a line, consecutive worker counts with the same call together:
    "N=1-8 too close to call; N=16-1024 neighbor_allreduce 1.06-1.08x", and where two
    are too close but both ahead of the rest, "N=16-128 a or b (too close to call), both
    1.53-1.84x c or more"."""
    def short(row: Row) -> str:
        return row.strategy.split(" (")[0]

    def call(v: Verdict):
        if v.called:
            return (short(v.fastest), None)
        if v.both_ahead:
            # settings stripped only where the names stay apart
            names = [short(r) for r in (v.fastest, v.runner_up, v.third)]
            if len(set(names)) < 3:
                names = [r.strategy for r in (v.fastest, v.runner_up, v.third)]
            return (" or ".join(sorted(names[:2])), names[2])
        return None

    def span(ratios: List[float]) -> str:
        low, high = min(ratios), max(ratios)
        return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"

    parts = []
    for key, same in itertools.groupby((v for v in verdicts if v.runner_up is not None),
                                       key=call):
        same = list(same)
        ns = f"N={same[0].workers}" + (f"-{same[-1].workers}" if len(same) > 1 else "")
        if key is None:
            parts.append(f"{ns} too close to call")
        elif key[1] is None:
            parts.append(f"{ns} {key[0]} {span([v.ratio for v in same])}")
        else:
            parts.append(f"{ns} {key[0]} (too close to call), both "
                         f"{span([v.lead for v in same])} {key[1]} or more")
    return "; ".join(parts)
