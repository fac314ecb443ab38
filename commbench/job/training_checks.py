"""What a run trained to a target needs, checked on every rank before any communication:
something to learn, and a target of the model's kind that can be reached (an image
model's is an accuracy, a language model's a loss above its language's floor; real
text's floor is unknown, so any positive loss is taken)."""

from __future__ import annotations

from commbench.config.run_config import RunConfig
from commbench.data import batches
from commbench.data.language import MarkovLanguage
from commbench.errors import UsageError
from commbench.job.stop_rule import AccuracyFlags


def check(config: RunConfig) -> None:
    if not config.trains_to_accuracy:
        return
    if config.data == "synthetic":
        flag = next(f"--{name.replace('_', '-')}" for name in AccuracyFlags.names()
                    if getattr(config, name) is not None)
        if config.language_model is not None:
            raise UsageError(f"argument {flag}: training to a target loss needs --data "
                             "language or text:PATH (synthetic tokens are one fixed batch: "
                             "nothing to learn)")
        raise UsageError(f"argument {flag}: training to accuracy needs --data learnable, "
                         "cifar10:PATH or imagefolder:PATH (the synthetic batch is one fixed "
                         "batch: nothing to learn)")
    source = batches.parse(config.data, config.seed) if config.target_loss else None
    if isinstance(source, MarkovLanguage) and config.target_loss <= source.entropy_rate:
        raise UsageError(f"argument --target-loss: {config.target_loss:g} can never be "
                         f"reached: {source.describe()} loses {source.entropy_rate:.4f} "
                         "nats/token at best (its entropy rate, the floor of the loss)")
