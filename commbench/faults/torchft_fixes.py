"""Where torchft 0.2's own classes break under the failures commbench injects, and the
smallest change that lets them go on (as optimizers/bluefog_fixes.py does for Bluefog).

torchft's DistributedDataParallel hands the reducer the future inside its Manager's
allreduce (`fut._fut`), asserting that there is one. Once an allreduce has failed (a
peer killed in the middle of it: torchft issue #304), the Manager answers every later
bucket of the step with a work whose future has none, and the assertion ends the
surviving group instead of letting the Manager skip the step. Here such a bucket gets a
future already holding its own buffer: the Manager has recorded the error, so it will
not commit the step, and the buffer's contents are never applied."""

from __future__ import annotations

from typing import Any


def completed_bucket(manager, bucket):  # unannotated: DDP checks a hook's annotations
    """torchft's DDP hook, but a bucket the Manager no longer reduces is completed as is."""
    import torch

    work = manager.allreduce(bucket.buffer())
    work.wait()
    inner = getattr(work.get_future(), "_fut", None)
    if inner is not None:
        return inner
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def distributed_data_parallel(manager: Any, model: Any) -> Any:
    """torchft's DistributedDataParallel over `model`, with the hook above."""
    from torchft import DistributedDataParallel

    class Surviving(DistributedDataParallel):
        _comm_hook = staticmethod(completed_bucket)

    return Surviving(manager, model)


def checkpoint_transport(host: str, timeout: Any) -> Any:
    """torchft's HTTP checkpoint transport, but advertising `host`: torchft's own tells a
    healing peer to fetch the state from socket.gethostname(), which names the host's
    interface and not the one a replica group was placed on (an emulated machine's:
    healing would not cross its link)."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class Advertised(HTTPTransport):
        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            return f"http://{host}:{port}/checkpoint/"

    return Advertised(timeout=timeout, num_chunks=0)
