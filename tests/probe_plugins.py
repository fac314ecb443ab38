"""Strategies that write down what commbench asks of them, loaded by dotted path."""

import os

from commbench.optimizers.allreduce import Allreduce

SETTLE_LOG = "COMMBENCH_TEST_SETTLE_LOG"  # a file: the step count at each settle()


class Settles(Allreduce):
    """allreduce, writing its step count each time it is asked to settle."""

    name = "settles"

    def wrap(self, model, optimizer):
        step = super().wrap(model, optimizer)
        self.steps = 0

        def counted(images, labels):
            self.steps += 1
            return step(images, labels)

        return counted

    def settle(self) -> None:
        with open(os.environ[SETTLE_LOG], "a") as log:
            log.write(f"{self.steps}\n")
