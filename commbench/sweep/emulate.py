"""A sweep on emulated clusters (--emulate): one cluster per link rate, made for that
rate's jobs and removed after them, whatever happened; the jobs of `--link shm` on this
machine's shared memory, with no cluster.
"""

from __future__ import annotations

import os
from typing import Dict, List, Sequence, Tuple

from commbench.sweep.execute import run_jobs
from commbench.sweep.plan import SHARED_MEMORY, Job


def run_emulated(jobs: List[Job], timeout: float, env: Dict[str, str], name: str,
                 shape: Tuple[int, int], link_of: Sequence[str] = ()) -> None:
    """run_jobs on one emulated cluster per link rate, each removed at the end: on
    success, failure, Ctrl-C or SIGTERM (after a SIGKILL: `commbench cluster down
    --name NAME`)."""
    from commbench.cluster import host, namespaces

    host.check_privileges()
    for link in dict.fromkeys(j.link for j in jobs):
        if link == SHARED_MEMORY:
            print("On this machine's shared memory (no cluster)", flush=True)
            run_jobs([j for j in jobs if j.link == link], timeout, env)
            continue
        uneven = f" ({', '.join(link_of)} their own)" if link_of else ""
        print(f"Emulated cluster {name}: {shape[0]} machines x {shape[1]} slots at {link}{uneven} "
              f"(if this sweep is killed: commbench cluster down --name {name})", flush=True)
        try:
            cluster = namespaces.up(name, shape[0], shape[1], link, link_of)
            # a machine a job's --fail cut off comes back only once its rank has ended
            run_jobs([j for j in jobs if j.link == link], timeout,
                     {**env, "PATH": f"{cluster.bin}{os.pathsep}{env.get('PATH', '')}"},
                     lambda: namespaces.wait_for_machines(
                         "commbench sweep", {cluster.machine(i) for i in range(shape[0])}))
        finally:
            namespaces.down(name)
