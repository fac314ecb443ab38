"""The steps of start-up after the roll call that wait on every rank without a roll call
of their own: torch.distributed's process group, which connects every pair of ranks,
and the first exchange over it. A rank that stops before one of them leaves the others
to torch's or gloo's own time-out ("Timed out waiting 20000ms for send operation to
complete"), which names nobody. So each rank reports in the roll call's store as it
enters such a step, and rank 0, when the step ends in an error, names the ranks that
never entered it, in the start-up line of the roll call (commbench.job.failure)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional, Sequence

from commbench.job.failure import name_ranks, startup_failed


class LateRanks:
    """`with late.step(what):` around a start-up step of every rank. store: the roll
    call's (None where there was none: one rank, or a process group set up by the
    program that embeds commbench); hosts: every rank's machine where rank 0 knows it."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout: float,
                 hosts: Sequence[Optional[str]] = ()) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout, self.hosts = timeout, hosts

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        if self.store is None:
            yield
            return
        self.store.add(self._key(what, self.rank), 1)
        try:
            yield
        except RuntimeError:
            missing = self._missing(what) if self.rank == 0 else []
            if missing:
                startup_failed(f"{name_ranks(missing, self.hosts)} of {self.world_size} did "
                               f"not reach {what} within {self.timeout:g} s (--timeout)")
            raise  # no rank is missing (or this rank cannot tell): not a late rank's doing

    def _missing(self, what: str) -> List[int]:
        try:  # adding 0 reads a counter without waiting (as the roll call does)
            return [r for r in range(self.world_size)
                    if self.store.add(self._key(what, r), 0) == 0]
        except RuntimeError:
            return []  # the store itself is gone: nothing to tell

    @staticmethod
    def _key(what: str, rank: int) -> str:
        return f"commbench/entered/{what}/{rank}"
