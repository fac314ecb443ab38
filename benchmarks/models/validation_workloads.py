"""The workloads simulate_validation.py projects: the flags of their runs, what one
worker's step counts (images, or tokens), and their gradients' layout as `commbench
simulate` reads it."""

from typing import List, NamedTuple


class Workload(NamedTuple):
    model: str
    size: int  # pixels per side, or tokens per sequence
    batch: int
    flags: List[str]  # the runs' model and data flags

    @property
    def per_step(self) -> int:
        from commbench.simulate import language

        return language.per_step(self.model, self.batch, self.size)

    def gradients(self):
        from commbench.simulate import language

        return language.gradients(self.model, self.size)

    def reference_compute(self, runs):
        """A step's compute from the runs' own in-job reference (two host cores are shared
        by every rank, so CPU sharing is measured, not modelled)."""
        from commbench.simulate import compute

        return compute.measured(
            [t for r in runs for t in _flat(r.doc["samples"]["reference_batch_seconds"])],
            [t for r in runs for t in _flat(r.doc["samples"]["reference_phase_seconds"])],
            self.gradients().forward_share, "in-job reference")


RESNET = Workload("resnet18", 32, 32, ["--model", "resnet18", "--image-size", "32",
                                       "--batch-size", "32"])
# The smallest language model on synthetic tokens: its speed runs read no data.
LANGUAGE = Workload("lm-tiny", 64, 8, ["--model", "lm-tiny", "--seq-len", "64",
                                       "--batch-size", "8"])
WORKLOADS = {w.model: w for w in (RESNET, LANGUAGE)}


def _flat(nested):
    import numpy as np

    return np.ravel(nested).tolist() if nested else []
