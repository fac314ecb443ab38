"""An external commbench plugin: average all parameters over every worker after each
local SGD step (torch.distributed all_reduce), plus a plugin that cannot run here,
so that `commbench list` has a reason to show."""

from commbench.optimizers.base import Strategy, local_step


class ParameterAverage(Strategy):
    name = "example_average"
    summary = "example plugin: local SGD step, then average the parameters over all workers"

    def wrap(self, model, optimizer):
        import torch.distributed as dist

        train = local_step(model, optimizer)
        size = self.ctx.world_size

        def step(images, labels):
            loss = train(images, labels)
            for p in model.parameters():
                dist.all_reduce(p.data)
                p.data.div_(size)
            return loss

        return step

    def facts(self):
        return {"plugin_package": "commbench-plugin-example"}


class NeedsAMissingModule(Strategy):
    name = "example_unusable"
    summary = "example plugin that needs a module nobody has"
    requires = ("commbench_example_no_such_module",)
