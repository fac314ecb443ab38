"""The run configuration: one frozen object from the command line to the result file.

Every `commbench run` flag is a field of `RunConfig`; the parser is generated from
the fields so that flags, defaults, validation and the recorded config never drift
apart. Flag names and defaults follow Horovod's and Bluefog's synthetic benchmarks.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Optional


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError
    return value


# Shown after "must be" in the error for a bad value.
ACCEPTED = {
    positive_int: "a positive integer",
    non_negative_int: "an integer >= 0",
    positive_float: "a positive number",
    non_negative_float: "a number >= 0",
}

CPU_TRANSPORTS = ("auto", "gloo", "mpi")


def cpu_transport(text: str) -> str:
    if text not in CPU_TRANSPORTS:
        raise ValueError
    return text


ACCEPTED[cpu_transport] = "one of " + ", ".join(CPU_TRANSPORTS)


def flag(default: Any, help: str, type: Any = None, metavar: Optional[str] = None) -> Any:
    return field(default=default, metadata={"help": help, "type": type, "metavar": metavar})


@dataclass(frozen=True)
class RunConfig:
    model: str = flag("resnet50", "torchvision classification model", metavar="NAME")
    batch_size: int = flag(32, "input batch size per worker", positive_int)
    image_size: int = flag(224, "synthetic image height and width in pixels", positive_int)
    num_classes: int = flag(1000, "number of classes of the synthetic labels", positive_int)
    num_warmup_batches: int = flag(10, "untimed batches before the benchmark", non_negative_int)
    num_batches_per_iter: int = flag(10, "batches per timed iteration", positive_int)
    num_iters: int = flag(10, "timed iterations", positive_int)
    reference_iters: int = flag(
        3, "iterations of the compute-only reference measured in the same job "
        "(for in-job scaling efficiency; 0 = skip)", non_negative_int)
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
    fp16_allreduce: bool = flag(False, "compress communicated tensors to float16")
    use_adasum: bool = flag(False, "horovod: combine gradients with Adasum instead of "
                            "averaging them")
    hierarchical_allreduce: bool = flag(False, "horovod: hierarchical allreduce (inside "
                                        "each machine, then across machines)")
    cpu_transport: str = flag(
        "auto", "how allreduce and neighbor exchanges move CPU tensors: mpi (mpi4py, "
        "under an MPI launcher), gloo, or auto (mpi when available)", cpu_transport,
        "{auto,gloo,mpi}")
    no_cuda: bool = flag(False, "run on the CPU even when a GPU is available")
    lr: float = flag(0.01, "SGD learning rate", non_negative_float)
    momentum: float = flag(0.9, "SGD momentum", non_negative_float)
    seed: int = flag(42, "random seed of model weights and synthetic data", int)
    timeout: float = flag(300.0, "seconds a collective may wait for a peer before the job "
                          "is ended", positive_float, "SECONDS")
    results_dir: str = flag("results", "directory for result files", metavar="DIR")
    tag: str = flag("", "free-form label stored with the result (e.g. an A/B arm)")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "RunConfig":
        """Rebuild a config from a result file, ignoring keys this version does not know."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per RunConfig field (`batch_size` -> `--batch-size`)."""
    for f in dataclasses.fields(RunConfig):
        name = "--" + f.name.replace("_", "-")
        meta = f.metadata
        if f.type in ("bool", bool):
            parser.add_argument(name, action="store_true", help=meta["help"])
            continue
        convert = meta["type"] or str
        parser.add_argument(name, type=_checked(convert), default=f.default,
                            metavar=meta["metavar"] or f.name.upper(),
                            help=f"{meta['help']} (default: {f.default})")


def _checked(convert):
    """Wrap a converter so argparse reports what values the flag accepts."""
    def parse(text: str):
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {ACCEPTED.get(convert, 'a ' + convert.__name__)}, got {text!r}")
    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def config_from_args(args: argparse.Namespace) -> RunConfig:
    names = {f.name for f in dataclasses.fields(RunConfig)}
    return RunConfig(**{k: v for k, v in vars(args).items() if k in names})
