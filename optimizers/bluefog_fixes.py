"""What Bluefog 0.3.0 (its last release) needs to run right with today's torch, done
from outside: its waits made to release the GIL, and its hierarchical neighbor
allreduce run as Bluefog fixed it after the release. Bluefog's source is not patched
(docs/engines.md says how each fault was found)."""

from __future__ import annotations

import os


def wait_without_the_gil(bf) -> None:
    """Make Bluefog's waits release the GIL, or its optimizers hang.

    Bluefog 0.3.0's C++ waits (synchronize/wait, win_wait, and barrier without
    negotiation) spin holding the GIL, while since torch 1.10 its background thread
    needs the GIL to drop a finished op's tensor before it runs the next op: with two
    ops in flight the two threads wait on each other. Here the waits poll the handle
    from Python and sleep between polls, which releases the GIL; Bluefog's own wait
    then returns at once. Bluefog's optimizers look these functions up on the modules
    at call time, so they use them too.
    """
    import time

    import torch
    from bluefog.torch import mpi_ops

    if getattr(mpi_ops, "commbench_waits_release_the_gil", False):
        return
    lib, synchronize, win_wait = mpi_ops.mpi_lib, mpi_ops.synchronize, mpi_ops.win_wait

    def until(done, handle) -> None:
        while not done(handle):
            time.sleep(1e-4)

    def gil_free_synchronize(handle):
        if handle in mpi_ops._handle_map:
            until(lib.bluefog_torch_poll, handle)
        return synchronize(handle)

    def gil_free_win_wait(handle):
        if handle in mpi_ops._win_handle_map:
            until(lib.bluefog_torch_win_poll, handle)
        return win_wait(handle)

    def gil_free_barrier():
        gil_free_synchronize(mpi_ops.allreduce_nonblocking(torch.zeros(1),
                                                           name="commbench.barrier"))

    for module in (mpi_ops, bf):
        module.synchronize = module.wait = gil_free_synchronize
        module.win_wait = gil_free_win_wait
        module.barrier = gil_free_barrier
    mpi_ops.commbench_waits_release_the_gil = True


# Releases out before Bluefog fixed its hierarchical neighbor allreduce.
HIERARCHICAL_UNFIXED = {"0.3.0"}


def hierarchical_as_fixed_upstream() -> None:
    """Run Bluefog 0.3.0's hierarchical neighbor allreduce as Bluefog fixed it after
    the release (Bluefog-Lib/bluefog#96, never released).

    Two faults: its Python calls the compiled op with an older argument list (the
    out-neighbor machines as a list and no dst-weighting flag), which pybind refuses;
    and on CPU its fused path copies the first tensor's machine sum back into every
    tensor of the fusion. Here the call is translated to the op's own argument list
    (uniform destination weights, as the list meant) and fusion is turned off, so
    every parameter takes the unfused path, which is right. Bluefog's source is not
    patched; its own Python still computes the weights and machine ranks.
    """
    from bluefog.torch import mpi_ops

    os.environ["BLUEFOG_FUSION_THRESHOLD"] = "0"  # read once, when bf.init() starts
    if not isinstance(mpi_ops.mpi_lib, _OpsWithTheirOwnArguments):
        mpi_ops.mpi_lib = _OpsWithTheirOwnArguments(mpi_ops.mpi_lib)


class _OpsWithTheirOwnArguments:
    """Bluefog's compiled ops, except that a neighbor allreduce called with 0.3.0's
    hierarchical argument list is called with the list the op declares."""

    OLD_HIERARCHICAL_ARGUMENTS = 10

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        op = getattr(self._lib, name)
        if not name.startswith("bluefog_torch_neighbor_allreduce_nonblocking"):
            return op

        def declared(*args):
            if len(args) == self.OLD_HIERARCHICAL_ARGUMENTS:
                tensor, output, self_weight, src, dst, dynamic, *rest = args
                args = (tensor, output, self_weight, src, {d: 1.0 for d in dst}, dynamic,
                        False, *rest)  # dst_weighting_enabled: every weight is 1
            return op(*args)

        return declared
