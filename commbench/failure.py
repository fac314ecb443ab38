"""What a rank does when something unexpected breaks: say so in one line that names
the rank, then end the whole job at once instead of leaving peers waiting."""

from __future__ import annotations

import os
import sys
import traceback


def describe_and_abort(error: BaseException) -> None:
    from commbench.launch.environment import detect_launch

    try:
        rank = detect_launch().rank
    except Exception:
        rank = "?"
    text = str(error).strip().splitlines()
    detail = text[0] if text else ""
    print(f"commbench: error: rank {rank}: {type(error).__name__}: {detail}",
          file=sys.stderr, flush=True)
    if os.environ.get("COMMBENCH_DEBUG"):
        traceback.print_exception(type(error), error, error.__traceback__)
    _abort(1)


def _abort(code: int) -> None:
    # Under MPI a normal exit would enter MPI_Finalize, which waits for every peer:
    # Abort makes the launcher kill all ranks now.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() \
            and mpi.COMM_WORLD.Get_size() > 1:
        mpi.COMM_WORLD.Abort(code)
    sys.stderr.flush()
    # Skip interpreter teardown: process-group destructors can block on dead peers.
    os._exit(code)
