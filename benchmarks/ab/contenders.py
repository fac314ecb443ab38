"""The table of A/B contenders: each entry is one question answered by two (or three)
arms measured in paired rounds, so that the machine's drift hits the arms alike, and
the ratio printed against a target. `python benchmarks/ab/ab.py NAME` runs one.

Two kinds: an in-job contender (`arms` names its function in arms.py) runs under a
launcher, every rank running every arm in each round (in_job.py's loop); a job
contender (`runner`) launches whole jobs itself, one per arm and round. The table is
data only: loading it imports neither torch nor the engines."""

from dataclasses import dataclass, field
from typing import Dict, Mapping

RECORDED = "docs/measurements.md"
SPEED = {"model": "resnet18", "image_size": 32, "num_iters": 5, "reference_iters": 0}


@dataclass(frozen=True)
class Contender:
    name: str
    question: str  # one line: what the ratio answers
    command: str  # the command as documented (benchmarks/README.md, docs/)
    target: str  # as the run prints it
    recorded: str  # where its figures are written down
    arms: str = ""  # in-job: the function of arms.py that sets up the arms
    defaults: Mapping = field(default_factory=dict)  # in-job: `commbench run` flag defaults
    runner: str = ""  # job contender: "module:function", called with the remaining argv


CONTENDERS: Dict[str, Contender] = {c.name: c for c in [
    Contender(
        "allreduce",
        "Does the harness cost anything? commbench's `allreduce` against a minimal "
        "hand-written DDP loop (both on gloo unless --cpu-transport mpi)",
        "mpiexec -n 2 python benchmarks/ab/ab.py allreduce [--rounds 3] [run flags]",
        "commbench/hand-written >= 0.98", "none written down yet",
        arms="allreduce", defaults={**SPEED, "cpu_transport": "gloo"}),
    Contender(
        "allreduce_lm",
        "Does the harness cost anything on a language model? commbench's `allreduce` on "
        "lm-tiny against a bare DDP + AdamW loop (same model, batch, sequence length and "
        "synthetic tokens; gradients clipped in both, as the recipe does; fp32, gloo)",
        "mpiexec -n 2 python benchmarks/ab/ab.py allreduce_lm [--rounds 20] [run flags]",
        "commbench/hand-written >= 0.98", f"{RECORDED}#the-harness-on-a-language-model",
        arms="allreduce", defaults={
            "model": "lm-tiny", "seq_len": 64, "batch_size": 8, "num_iters": 3,
            "num_batches_per_iter": 4, "num_warmup_batches": 2, "reference_iters": 0,
            "cpu_transport": "gloo", "amp": "off", "no_cuda": True, "rounds": 20}),
    Contender(
        "horovod",
        "Does commbench's `horovod` plugin cost anything? Against a hand-written Horovod "
        "loop (the shape of Horovod's pytorch_synthetic_benchmark.py)",
        "horovodrun -np 2 python benchmarks/ab/ab.py horovod [--rounds 5] [run flags]",
        "commbench/hand-written >= 0.98", "none written down yet",
        arms="horovod", defaults=SPEED),
    Contender(
        "bluefog",
        "commbench's own neighbor_allreduce against Bluefog's on the same model, batch, "
        "topology and schedule (in the Bluefog environment)",
        ".venv-bluefog/bin/bfrun -np 4 --extra-mpi-flags=\"--oversubscribe\" "
        ".venv-bluefog/bin/python benchmarks/ab/ab.py bluefog [--model resnet50 --image-size 32]",
        "commbench/Bluefog >= 1", "docs/engines.md#measured-here",
        arms="bluefog", defaults={
            "model": "squeezenet1_1", "image_size": 64, "num_classes": 10, "batch_size": 16,
            "num_iters": 5, "num_batches_per_iter": 5, "num_warmup_batches": 3,
            "reference_iters": 0, "timeout": 120.0}),
    Contender(
        "timeline",
        "What recording where a step's time goes costs: spans recorded (the default), "
        "with --timeline, and recording off, in rounds whose order rotates",
        "mpiexec -n 2 python benchmarks/ab/ab.py timeline [--rounds 5] [run flags]",
        "recorded/off: no change; timeline/off >= 0.97",
        f"{RECORDED}#the-cost-of-the-timeline",
        arms="timeline", defaults={**SPEED, "dist_optimizer": "neighbor_allreduce", "rounds": 5}),
    Contender(
        "data",
        "What serving a learnable task's batches costs a run: the fixed synthetic batch "
        "against the worker's shard of a learnable task",
        "mpiexec -n 2 python benchmarks/ab/ab.py data [--rounds 5] [run flags]",
        "learnable/synthetic >= 0.95",
        f"{RECORDED}#where-the-link-binds-emulated-machines-at-200-mbits; {RECORDED}#on-one-gpu",
        arms="data", defaults={**SPEED, "dist_optimizer": "allreduce", "rounds": 5}),
    Contender(
        "emulation",
        "What does the emulation itself cost? The same 1-machine job inside an emulated "
        "machine and outside it (needs root)",
        "python benchmarks/ab/ab.py emulation [--rounds 3] [--together] [run flags]",
        "inside/outside >= 0.95", f"{RECORDED}#the-cost-of-the-emulation-itself",
        runner="emulation:main"),
    Contender(
        "revisions",
        "Is a change no slower? `commbench microbench` under two git revisions of "
        "commbench/ (or two sets of flags)",
        "python benchmarks/ab/ab.py revisions --old REV [--new HEAD] [--rounds 3] "
        "[--launch \"mpiexec -n 4\"] -- MICROBENCH FLAGS",
        "old/new: a size regresses when its 95% CI lies wholly below 0.95",
        f"{RECORDED}#every-strategy-at-link-rate; {RECORDED}#small-messages-between-machines",
        runner="revisions:main"),
]}
