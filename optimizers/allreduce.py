"""`allreduce`: average gradients over all workers with torch's DistributedDataParallel,
which buckets gradients and overlaps their allreduce with the backward pass."""

from commbench.optimizers.base import Strategy, TrainStep, local_step


class Allreduce(Strategy):
    name = "allreduce"
    summary = "average gradients over all workers (torch DDP: bucketed, overlapped with backward)"

    def wrap(self, model, optimizer) -> TrainStep:
        from torch.nn.parallel import DistributedDataParallel

        on_gpu = self.ctx.device.type == "cuda"
        # DDP broadcasts rank 0's parameters here, so all workers start equal.
        ddp = DistributedDataParallel(model, device_ids=[self.ctx.device] if on_gpu else None)
        if self.config.fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return local_step(ddp, optimizer)
