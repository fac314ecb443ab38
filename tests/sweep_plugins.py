"""A strategy that fails on purpose, loaded by dotted path in the sweep tests."""

from commbench.optimizers.base import Strategy


class Crashes(Strategy):
    name = "crashes"
    summary = "raises while wrapping the model"

    def wrap(self, model, optimizer):
        raise RuntimeError("this strategy fails on purpose")
