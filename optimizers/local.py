"""`none`: no communication. The compute-only reference against which scaling
efficiency is measured inside one job."""

from commbench.optimizers.base import Strategy, TrainStep
from commbench.job.training_step import TrainingStep


class Local(Strategy):
    name = "none"
    summary = "no communication: every worker trains alone (compute-only reference)"
    decentralized = True  # workers' models drift apart; the consensus distance shows how far
    communicates = False
    restartable = True

    def wrap(self, model, optimizer) -> TrainStep:
        return TrainingStep(model, optimizer)
