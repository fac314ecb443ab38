"""An external commbench plugin: average all parameters over every worker after every
N-th local SGD step (torch.distributed all_reduce; N is the plugin's own flag
--average-every), plus a plugin that cannot run here, so that `commbench list` has a
reason to show."""

from dataclasses import dataclass

from commbench.flags import flag, positive_int
from commbench.optimizers.base import Strategy, local_step


@dataclass(frozen=True)
class AverageOptions:
    average_every: int = flag(1, "average the parameters after every N-th step", positive_int)


class ParameterAverage(Strategy):
    name = "example_average"
    summary = "example plugin: local SGD steps, then average the parameters over all workers"
    Options = AverageOptions

    def wrap(self, model, optimizer):
        import torch.distributed as dist

        train = local_step(model, optimizer)
        size, every, steps = self.ctx.world_size, self.options.average_every, [0]

        def step(images, labels):
            loss = train(images, labels)
            steps[0] += 1
            if steps[0] % every == 0:
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
