"""The run configuration: one frozen object from the command line to the result file.

RunConfig's fields are the flags of `commbench run`; `microbench` and `sweep` take the
ones they share with it from here (commbench.config.flags generates the flags, so a flag, its
default, its check and the recorded value never drift apart). A plugin's own flags
are the fields of its Options dataclass (commbench.optimizers.base); their values
travel in `RunConfig.options` and are recorded beside the others. Flag names and
defaults follow Horovod's and Bluefog's synthetic benchmarks.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from commbench.config import compression
from commbench.job import straggler
from commbench.job.language_models import LANGUAGE_MODELS, LanguageModelSpec
from commbench.errors import UsageError
from commbench.config.flags import (add_flags, flag, flag_fields, fraction, integer,
                             non_negative_float, non_negative_int, one_of, option_name,
                             positive_float, positive_int)
from commbench.data import language
from commbench.data.local import AUGMENTS
from commbench.job.precision import AMP_MODES

CPU_TRANSPORTS = ("auto", "gloo", "mpi")
# Steps a timeline keeps by default: a few hundred events per rank and step at most, so
# a file of 16 ranks stays within tens of megabytes.
TIMELINE_STEPS = 200
# Training to accuracy: how often the models are evaluated, and the bound on a run given
# neither --max-epochs nor --time-budget.
EVAL_EVERY = 20
MAX_EPOCHS = 20.0
# The flags of a speed run alone: training to accuracy counts steps and epochs, not timed
# iterations, and measures no compute-only reference (--reference-iters 0 says so).
SPEED_RUN_FLAGS = ("num_warmup_batches", "num_batches_per_iter", "num_iters",
                   "reference_iters", "reference_seconds")


@dataclass(frozen=True)
class RunConfig:
    model: str = flag("resnet50", "torchvision classification model", metavar="NAME")
    batch_size: int = flag(32, "input batch size per worker", positive_int)
    image_size: int = flag(224, "image height and width in pixels (a dataset's images are "
                           "brought to it)", positive_int)
    seq_len: Optional[int] = flag(
        None, "a language model's sequence length in tokens (default: the model's, "
        "`commbench list`: 128 for lm-tiny, 1024 for gpt2-small, 2048 for llama-1b)",
        positive_int, "TOKENS")
    num_classes: int = flag(1000, "number of classes of the synthetic labels", positive_int)
    data: str = flag("synthetic", "what to train on: synthetic (one fixed random batch, for "
                     "speed), learnable[:classes=N,noise=X,samples=N] (a classification "
                     "task generated from --seed), language[:vocab=V,order=K,branch=B,"
                     "samples=N] (a language model's: a Markov source from --seed, its "
                     "entropy rate the floor of the loss), cifar10:PATH or imagefolder:PATH "
                     "(read from disk, never downloaded)", metavar="SPEC")
    augment: str = flag("auto", "a dataset's training augmentation: auto (CIFAR-10 and "
                        "images of at most 64 px: a padded random crop and a flip; larger "
                        "images: ImageNet's random-resized crop and a flip), crop-flip, "
                        "resized-crop or none", one_of(AUGMENTS), "KIND")
    partition: str = flag("iid", "how a dataset's training samples are split among the "
                          "workers: iid, or dirichlet:ALPHA (label skew)", metavar="SPEC")
    target_accuracy: Optional[float] = flag(
        None, "train to accuracy instead of timing iterations: end the run when the "
        "workers' averaged model reaches this validation accuracy (needs --data other than "
        "synthetic)",
        fraction, "X")
    eval_every: Optional[int] = flag(
        None, "training to accuracy: evaluate every N steps, the clock paused (default: "
        f"{EVAL_EVERY})", positive_int, "STEPS")
    time_budget: Optional[float] = flag(
        None, "training to accuracy: stop after this much training time (checked at each "
        "evaluation)", positive_float, "SECONDS")
    max_epochs: Optional[float] = flag(
        None, "training to accuracy: stop after this many passes over the training set "
        f"(default: {MAX_EPOCHS} when no --time-budget is given)", positive_float, "N")
    num_warmup_batches: int = flag(10, "untimed batches before the benchmark", non_negative_int)
    num_batches_per_iter: int = flag(10, "batches per timed iteration", positive_int)
    num_iters: int = flag(10, "timed iterations", positive_int)
    reference_iters: int = flag(
        3, "iterations of the compute-only reference measured in the same job, half before "
        "the run and half after it (for in-job scaling efficiency; 0 = skip)",
        non_negative_int)
    reference_seconds: float = flag(
        1.0, "the least wall-clock time of each half of the compute-only reference",
        non_negative_float, "SECONDS")
    dist_optimizer: str = flag("allreduce", "communication strategy (see `commbench list`)",
                               metavar="NAME")
    topology: str = flag("exponential-2", "topology of decentralized strategies "
                         "(see `commbench list`)", metavar="NAME")
    disable_dynamic_topology: bool = flag(False, "use the static topology every step "
                                          "instead of the dynamic one-peer schedule")
    atc_style: bool = flag(False, "adapt-then-combine (x' = W(x - lr g)) instead of "
                           "adapt-with-combine (x' = Wx - lr g)")
    machine_size: Optional[int] = flag(
        None, "split the ranks into simulated machines of this many ranks "
        "(default: the launcher's local size)", positive_int, "N")
    independent_init: bool = flag(False, "initialise each worker's model with its own seed "
                                  "instead of broadcasting rank 0's parameters")
    compression: str = flag(
        "none", "what the strategy's messages travel as: none, fp16, bf16, or (allreduce) "
        "powersgd:RANK[,start=N][,min_rate=X], torch's PowerSGD; `commbench list` says which "
        "strategy takes which (commbench.config.compression)", compression.spec, "KIND")
    fp16_allreduce: bool = flag(False, "compress communicated tensors to float16 (Horovod's "
                                "spelling of --compression fp16)")
    amp: str = flag("off", "mixed precision: the forward pass under autocast in bf16 (CPU or "
                    "GPU) or fp16 (GPU, with loss scaling)", one_of(AMP_MODES),
                    "{off,fp16,bf16}")
    cpu_transport: str = flag(
        "auto", "how allreduce and neighbor exchanges move CPU tensors: mpi (mpi4py, "
        "under an MPI launcher), gloo, or auto (mpi on one machine under an MPI launcher, "
        "gloo between machines)",
        one_of(CPU_TRANSPORTS), "{auto,gloo,mpi}")
    slow_ranks: str = flag(
        "none", "stragglers on purpose: these ranks compute FACTOR times slower (before each "
        "compute phase they idle FACTOR - 1 times its measured time), each step or, with @P, "
        "with probability P; recorded, and its own part of the step split "
        "(commbench.job.straggler)", straggler.spec, "RANKS:FACTOR[@P]")
    no_cuda: bool = flag(False, "run on the CPU even when a GPU is available")
    lr: Optional[float] = flag(
        None, "SGD learning rate (default: 0.01 for a speed run, as Horovod's and Bluefog's "
        "benchmarks; training to accuracy: the peak, 0.1 x total batch / 256; see "
        "commbench.job.recipe)", non_negative_float)
    momentum: float = flag(0.9, "SGD momentum", non_negative_float)
    weight_decay: Optional[float] = flag(
        None, "SGD weight decay (default: 0 for a speed run; 5e-4 training to accuracy)",
        non_negative_float, "W")
    warmup_epochs: float = flag(
        1.0, "training to accuracy: epochs of linear learning-rate warm-up before the cosine "
        "decay", non_negative_float, "N")
    seed: int = flag(42, "random seed of model weights and synthetic data", integer)
    timeout: float = flag(300.0, "seconds a collective may wait for a peer before the job "
                          "is ended", positive_float, "SECONDS")
    results_dir: str = flag("results", "directory for result files", metavar="DIR")
    tag: str = flag("", "free-form label stored with the result (e.g. an A/B arm)")
    timeline: Optional[str] = flag(
        None, "write every rank's spans (compute phases, communication pieces, waits) to "
        "FILE in Chrome's trace-event format (Perfetto, chrome://tracing)", metavar="FILE")
    timeline_steps: int = flag(
        TIMELINE_STEPS, "the most measured steps a --timeline file holds (the last ones)",
        positive_int, "N")
    # --- training a language model to a target loss ---
    target_loss: Optional[float] = flag(
        None, "a language model's --target-accuracy: end the run when the workers' averaged "
        "model's validation loss (nats per token) is at most X (needs --data language; "
        "above the floor it prints)", positive_float, "X")
    # Plugins' own flags (their Options fields) by name; not a flag itself.
    options: Mapping[str, Any] = field(default_factory=dict)
    # True when several plugins read this one config (microbench's ops): a topology flag
    # meant for some of them is then no mistake for the others. Not a flag, not recorded.
    shared_by_plugins: bool = field(default=False, compare=False)

    def to_dict(self) -> Dict[str, Any]:
        """What a result records: every flag, plugins' options beside the others."""
        values = {f.name: getattr(self, f.name) for f in flag_fields(RunConfig)}
        values.update(self.options)
        return values

    @property
    def language_model(self) -> Optional[LanguageModelSpec]:
        """The named size of a language model (commbench.job.language_models), else None."""
        return LANGUAGE_MODELS.get(self.model)

    @property
    def unit(self) -> str:
        """What throughput counts: a language model's tokens, an image model's images."""
        return "tokens" if self.language_model else "images"

    @property
    def per_sample(self) -> int:
        """How many of the unit one sample of a batch is: a sequence's tokens, or 1."""
        spec = self.language_model
        return (self.seq_len or spec.seq_len) if spec else 1

    @property
    def trains_to_accuracy(self) -> bool:
        """Whether this run trains to accuracy (commbench.job.accuracy_loop) rather than
        timing iterations."""
        return any(v is not None for v in (self.target_accuracy, self.eval_every,
                                           self.time_budget, self.max_epochs,
                                           self.target_loss))


def plugin_options() -> List[Tuple[str, List[dataclasses.Field]]]:
    """(plugin name, its option fields) of every installed plugin that declares some.
    A plugin that cannot be loaded declares nothing here (`commbench list` says why);
    one loaded by path (`module:Class`) runs with its options' defaults."""
    from commbench import registry

    found: List[Tuple[str, List[dataclasses.Field]]] = []
    core = {f.name for f in flag_fields(RunConfig)}
    seen: Dict[str, Tuple[str, dataclasses.Field]] = {}
    for name, cls in registry.loadable().items():
        fields = [f for f in flag_fields(cls.Options) if f.name not in core]
        clashes = [f.name for f in flag_fields(cls.Options) if f.name in core]
        if clashes:
            raise UsageError(f"plugin {name!r} declares {option_name(clashes[0])}, "
                             "which is a flag of commbench run")
        mine = []
        for f in fields:
            if f.name in seen:  # shared by plugins: one flag, if they agree on it
                other, known = seen[f.name]
                if (known.type, known.default) != (f.type, f.default):
                    raise UsageError(f"plugins {other!r} and {name!r} both declare "
                                     f"{option_name(f.name)}, differently")
                continue
            seen[f.name] = (name, f)
            mine.append(f)
        if mine:
            found.append((name, mine))
    return found


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of `commbench run`: RunConfig's, then each plugin's own, in a group."""
    add_flags(parser, flag_fields(RunConfig))
    for name, fields in plugin_options():
        add_flags(parser.add_argument_group(f"options of {name}"), fields, OPTION)


OPTION = "option:"  # where a plugin option's value lands in the parsed namespace


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of parsed flags; flags the command does not take keep their defaults.
    A command without --dist-optimizer checks several plugins against the one config."""
    values = vars(args)
    core = {f.name for f in flag_fields(RunConfig)}
    options = {k[len(OPTION):]: v for k, v in values.items() if k.startswith(OPTION)}
    config = RunConfig(**{k: v for k, v in values.items() if k in core}, options=options,
                       shared_by_plugins="dist_optimizer" not in values)
    refuse_data_flags_that_mean_nothing(config)
    refuse_model_flags_that_mean_nothing(config)
    if config.trains_to_accuracy:  # recorded as it runs: without the reference
        config = dataclasses.replace(config, reference_iters=0)
    return config


def _given(config: RunConfig, name: str) -> bool:
    """Whether a flag holds a value other than its default: all argparse leaves to tell
    a flag the user gave from one left alone."""
    default = next(f.default for f in dataclasses.fields(RunConfig) if f.name == name)
    return getattr(config, name) != default


def refuse_data_flags_that_mean_nothing(config: RunConfig) -> None:
    """A flag that the chosen data or kind of run would ignore is refused in one line,
    rather than recorded as if it had acted."""
    if _given(config, "partition") and config.data == "synthetic":
        raise UsageError("argument --partition: the synthetic batch is one fixed batch, "
                         "not a dataset to split among workers; give --data learnable, "
                         "cifar10:PATH or imagefolder:PATH, or leave --partition out")
    if _given(config, "num_classes") and config.data != "synthetic":
        raise UsageError(f"argument --num-classes: sets the classes of the synthetic batch; "
                         f"--data {config.data} has classes of its own (the result records "
                         "them): leave it out")
    if _given(config, "augment") and config.data.split(":")[0] in ("synthetic", "learnable",
                                                                   "language"):
        raise UsageError("argument --augment: augments the images of a dataset read from "
                         "disk (--data cifar10:PATH or imagefolder:PATH); generated data "
                         "has none to augment: leave it out")
    speed_only = [n for n in SPEED_RUN_FLAGS if _given(config, n)
                  and (n, getattr(config, n)) != ("reference_iters", 0)]
    if speed_only and config.trains_to_accuracy:
        raise UsageError(f"argument {option_name(speed_only[0])}: sets up a speed run's timed "
                         "iterations; training to accuracy counts steps and epochs "
                         "(--eval-every, --max-epochs, --time-budget) and measures no "
                         "compute-only reference: leave it out")
    if _given(config, "warmup_epochs") and not config.trains_to_accuracy:
        raise UsageError("argument --warmup-epochs: a speed run keeps its learning rate "
                         "constant; only training to accuracy (--target-accuracy, "
                         "--time-budget, --max-epochs) warms it up")


def refuse_model_flags_that_mean_nothing(config: RunConfig) -> None:
    """An image model's flags given with a language model are refused in one line, and
    --seq-len with an image model, rather than recorded as if they had acted."""
    spec = config.language_model
    language.check_pairing(config.data, config.model, spec and spec.vocab, config.seed,
                           _given(config, "partition"))
    if spec is None:
        if config.seq_len is not None:
            raise UsageError(f"argument --seq-len: sets a language model's sequence length; "
                             f"{config.model} is an image model (--image-size sets its "
                             "input): leave --seq-len out")
        return
    image_flags = [n for n in ("image_size", "num_classes") if _given(config, n)]
    if image_flags:
        raise UsageError(f"argument {option_name(image_flags[0])}: {config.model} is a "
                         "language model: it reads tokens (--seq-len), not images, and its "
                         "vocabulary is its own: leave it out")
    if config.per_sample > spec.context:
        raise UsageError(f"argument --seq-len: {config.model} takes at most {spec.context} "
                         f"tokens, not {config.per_sample}")
