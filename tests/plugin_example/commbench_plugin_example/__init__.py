"""An external commbench plugin: average all parameters over every worker after every
N-th local SGD step (N is the plugin's own flag --period), its microbench op, and a
plugin that cannot run here, so that `commbench list` has a reason to show. It calls
torch.distributed's all_reduce itself, uncounted, so that its results show the flag
of a strategy that records no bytes on the wire (docs/plugins.md counts them)."""

from dataclasses import dataclass

from commbench.config.flags import flag, positive_int
from commbench.microbench.ops.allreduce import Allreduce
from commbench.optimizers.base import Strategy
from commbench.job.training_step import TrainingStep


@dataclass(frozen=True)
class AverageOptions:
    period: int = flag(1, "average the parameters after every N-th step", positive_int)


class ParameterAverage(Strategy):
    name = "example_average"
    summary = "example plugin: local SGD steps, then average the parameters over all workers"
    Options = AverageOptions

    def wrap(self, model, optimizer):
        self.parameters, self.steps = list(model.parameters()), 0
        return TrainingStep(model, optimizer, after_update=self.average)

    def average(self, started):
        import torch.distributed as dist

        self.steps += 1
        if self.steps % self.options.period == 0:
            for p in self.parameters:
                dist.all_reduce(p.data)
                p.data.div_(self.ctx.world_size)

    def facts(self):
        return {"plugin_package": "commbench-plugin-example"}


class ParameterAverageOp(Allreduce):
    """microbench op `example_average`: one parameter of S bytes averaged as the plugin
    averages each parameter; raw rows as the `allreduce` op's."""

    name = "example_average"
    compresses = False

    def __init__(self, plugin_cls, ctx, config, data):
        super().__init__(plugin_cls, ctx, config, data)
        self.plugin.parameters, self.plugin.steps = [self.buffer], 0

    def run(self):
        self.plugin.average(0.0)  # --period 1, its default: every call averages


class NeedsAMissingModule(Strategy):
    name = "example_unusable"
    summary = "example plugin that needs a module nobody has"
    requires = ("commbench_example_no_such_module",)
