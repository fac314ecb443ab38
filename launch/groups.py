"""Process groups over parts of a job (one per machine), made once per job and layout
with the job's own patience."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, List, Optional

from commbench.config.flags import flag, positive_int
from commbench.config.sections import Section


@dataclass(frozen=True)
class MachineFlags(Section):
    title = "machines (strategies that group ranks into machines)"
    ignored_because = ("groups no ranks into machines; leave it out (the neighbor averaging "
                       "strategies and local_sgd's --average-every h1,h2 read it)")

    machine_size: Optional[int] = flag(
        None, "split the ranks into simulated machines of this many ranks "
        "(default: the launcher's local size)", positive_int, "N")


class Subgroups:
    """Process groups over parts of the job, made once per job and layout."""

    def __init__(self) -> None:
        self.timeout: Optional[timedelta] = None
        self._machines: Dict[int, List[Any]] = {}

    def forget(self) -> None:
        self._machines.clear()

    def machines(self, machine_size: int, world_size: int) -> List[Any]:
        """One group per machine of machine_size consecutive ranks. Collective: every
        rank calls it with the same sizes, in the same order."""
        import torch.distributed as dist

        if machine_size not in self._machines:
            options = {"timeout": self.timeout} if self.timeout else {}
            self._machines[machine_size] = [
                dist.new_group(list(range(m, m + machine_size)), **options)
                for m in range(0, world_size, machine_size)]
        return self._machines[machine_size]


SUBGROUPS = Subgroups()
machine_groups = SUBGROUPS.machines
