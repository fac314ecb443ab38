"""A strategy that fails on purpose, loaded by dotted path in the sweep tests."""

from commbench.optimizers.base import Strategy


class Crashes(Strategy):
    name = "crashes"
    summary = "raises while wrapping the model"

    def wrap(self, model, optimizer):
        raise RuntimeError("this strategy fails on purpose")


class NeedsMpi(Strategy):
    name = "needs-mpi"
    summary = "runs only under an MPI launcher, as the engines do"

    @classmethod
    def check(cls, config, launch) -> None:
        from commbench.errors import UsageError
        from commbench.launch.detect import MPI_WORLDS

        super().check(config, launch)
        if launch.launcher not in MPI_WORLDS:
            raise UsageError(f"needs-mpi cannot run under {launch.launcher}")
