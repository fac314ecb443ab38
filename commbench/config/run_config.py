"""The run configuration: one frozen object from the command line to the result file.

Each component declares its own flags as a section (commbench.config.sections) in its
own module; RunConfig is their union, so that every flag is read, recorded and checked
by one name (`config.topology`). `microbench` and `sweep` take the flags they share
with `commbench run` from here (commbench.config.flags generates the flags, so a flag,
its default, its check and the recorded value never drift apart). A plugin's own flags
are the fields of its Options dataclass (commbench.optimizers.base); their values
travel in `RunConfig.options` and are recorded beside the others. Flag names and
defaults follow Horovod's and Bluefog's synthetic benchmarks.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Tuple

from commbench.config.flags import (add_flags, flag, flag_fields, integer, one_of,
                                    option_name, positive_float)
from commbench.config.sections import Section, refuse_unread
from commbench.data import language
from commbench.data.batches import DataFlags
from commbench.errors import UsageError
from commbench.job.stop_rule import AccuracyFlags
from commbench.faults.fail_schedule import FailureFlags
from commbench.job.models import ModelFlags
from commbench.job.recipe import RecipeFlags
from commbench.faults.recovery import RecoveryFlags
from commbench.job.speed_loop import SpeedRunFlags
from commbench.job.straggler import StragglerFlags
from commbench.optimizers.base import STRATEGY_SECTIONS
from commbench.result.store import OutputFlags
from commbench.timing.trace_file import TimelineFlags

CPU_TRANSPORTS = ("auto", "gloo", "mpi")


@dataclass(frozen=True)
class JobFlags(Section):
    title = "the job"

    dist_optimizer: str = flag("allreduce", "communication strategy (see `commbench list`)",
                               metavar="NAME")
    independent_init: bool = flag(False, "initialise each worker's model with its own seed "
                                  "instead of broadcasting rank 0's parameters")
    cpu_transport: str = flag(
        "auto", "how allreduce and neighbor exchanges move CPU tensors: mpi (mpi4py, "
        "under an MPI launcher), gloo, or auto (mpi on one machine under an MPI launcher, "
        "gloo between machines)",
        one_of(CPU_TRANSPORTS), "{auto,gloo,mpi}")
    no_cuda: bool = flag(False, "run on the CPU even when a GPU is available")
    seed: int = flag(42, "random seed of model weights and synthetic data", integer)
    timeout: float = flag(300.0, "seconds a collective may wait for a peer before the job "
                          "is ended", positive_float, "SECONDS")


# The strategy sections are read only by the strategies that declare them
# (optimizers/base.py); the others by every run, as far as their own `unread` says.
SECTIONS = (JobFlags, *STRATEGY_SECTIONS, ModelFlags, DataFlags, SpeedRunFlags, AccuracyFlags,
            RecipeFlags, StragglerFlags, FailureFlags, RecoveryFlags, OutputFlags,
            TimelineFlags)  # in --help's order
JOB_SECTIONS = tuple(s for s in SECTIONS if s not in STRATEGY_SECTIONS)


@dataclass(frozen=True)
class RunConfig(*reversed(SECTIONS)):  # dataclasses order fields from the last base up
    # Plugins' own flags (their Options fields) by name; not a flag itself.
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        """What a result records: every flag, plugins' options beside the others."""
        values = {f.name: getattr(self, f.name) for f in flag_fields(RunConfig)}
        values.update(self.options)
        return values

    def started_alike(self) -> Tuple[str, str]:
        """(digest, text) of what every rank of a job must be started with: the flags and
        commbench's version; where results go is moot (only rank 0 writes them)."""
        from commbench import __version__

        flags = {k: v for k, v in self.to_dict().items() if k != "results_dir"}
        text = json.dumps([__version__, flags], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest(), text


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
    """Every flag of `commbench run`: a group per section, then each plugin's own."""
    for section in SECTIONS:
        add_flags(parser.add_argument_group(section.title), flag_fields(section))
    for name, fields in plugin_options():
        add_flags(parser.add_argument_group(f"options of {name}"), fields, OPTION)


OPTION = "option:"  # where a plugin option's value lands in the parsed namespace


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of parsed flags; flags the command does not take keep their defaults.
    A flag that the run's other values make moot (each job section's `unread`) is
    refused in one line, rather than recorded as if it had acted; what the strategy
    does not read, it refuses itself (commbench.registry.refuse_unread)."""
    values = vars(args)
    core = {f.name for f in flag_fields(RunConfig)}
    options = {k[len(OPTION):]: v for k, v in values.items() if k.startswith(OPTION)}
    config = RunConfig(**{k: v for k, v in values.items() if k in core}, options=options)
    spec = config.language_model
    refuse_unread(config, moot_for_the_job(config))
    language.check_pairing(config.data, config.model, spec and spec.vocab, config.seed)
    if spec is not None and config.per_sample > spec.context:
        raise UsageError(f"argument --seq-len: {config.model} takes at most {spec.context} "
                         f"tokens, not {config.per_sample}")
    if config.trains_to_accuracy:  # recorded as it runs: without the reference
        config = dataclasses.replace(config, reference_iters=0)
    return config


def moot_for_the_job(config: RunConfig) -> Dict[str, str]:
    """The flags of the job's sections that its other values make moot, with why."""
    return {name: why for section in JOB_SECTIONS for name, why in section.unread(config).items()}
