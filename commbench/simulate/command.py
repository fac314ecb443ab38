"""`commbench simulate [PATH...]`: project img/sec, scaling efficiency and the time
of each step's parts to other worker counts, machine sizes and links.

Compute comes from the compute-only reference of the run files under PATH (or
--img-sec, one device's throughput); the network from microbench files under PATH
or nccl-tests output given with --nccl-tests (or --link/--intra-link, under a transport
profile: --transport). Prints the answer first (the fastest strategy at each worker
count, or too close to call), then a table, writes a projection file (kind
"projection") and its chart into --output-dir, never among measured results.

This module is the command: its flags and the order of the work; calibrate fits,
project projects, table prints and projection_file stores.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from commbench.config import compression
from commbench.job import straggler
from commbench.errors import UsageError
from commbench.config.flags import periods, positive_float, positive_int
from commbench.simulate import (calibrate, calibration_files, engines, language,
                                network_inputs, nccl_tests_output, projection_file, published,
                                strategy_flags, table, transports)
from commbench.simulate.project import Inputs, project
from commbench.simulate.strategy import STRATEGIES

DEFAULT_WORKERS = "1,2,4,8,16,32,64,128,256,512,1024"


def add_arguments(parser) -> None:
    add = parser.add_argument
    add("paths", nargs="*", metavar="PATH", help="run and microbench result files or "
        "directories to calibrate on (runs: compute; microbench: links)")
    add("--np", default=DEFAULT_WORKERS, metavar="LIST",
        help=f"worker counts to project (default: {DEFAULT_WORKERS})")
    add("--gpus-per-machine", "--per-machine", dest="per_machine", type=positive_int, metavar="N",
        help="workers per machine (default: as in the largest run, else 8)")
    add("--dist-optimizer", metavar="LIST", help="strategies, comma-separated (default: "
        "those of the runs, else allreduce,neighbor_allreduce,"
        "hierarchical_neighbor_allreduce); modelled: " + ", ".join(STRATEGIES))
    add("--topology", default="exponential-2", help="topology of decentralized strategies")
    add("--disable-dynamic-topology", action="store_true",
        help="the static topology every step instead of the dynamic one-peer schedule")
    add("--atc-style", action="store_true", help="adapt-then-combine (no overlap)")
    add("--average-every", type=periods, default=8, metavar="H",
        help="local_sgd and diloco with --dist-optimizer: the models meet every H-th step "
        "(local_sgd on several machines: h1,h2) (default: 8)")
    add("--fp16-allreduce", action="store_true", help="every strategy's communication in "
        "float16 (default: each strategy as its runs sent, fp16 and bf16 runs a strategy of "
        "their own)")
    add("--compression", type=compression.spec, metavar="KIND",
        help="with --dist-optimizer: allreduce sends powersgd:RANK[,min_rate=X] as torch's "
        "PowerSGD hook does (its codec time comes from runs that measured it, else none); "
        "fp16 or bf16: every strategy sends 2-byte types (default: as the runs, when all of "
        "them did)")
    add("--slow-ranks", type=straggler.spec, metavar="RANKS:FACTOR[@P]",
        help="stragglers made on purpose, as `commbench run --slow-ranks`: these ranks "
        "compute FACTOR times slower (each step, or with probability P), where a "
        "projected worker count has them (default: the runs', when all had the same)")
    add("--hierarchical-allreduce", action="store_true", help="horovod: allreduce inside "
        "each machine, then across machines, then back (HOROVOD_HIERARCHICAL_ALLREDUCE)")
    add("--horovod-version", metavar="X", help="the Horovod release whose defaults "
        "horovod's cycle time and fusion threshold are modelled with: "
        f"{', '.join(engines.HOROVOD)} (default: {engines.HOROVOD_DEFAULT}, the one "
        "commbench's plugin is built with)")
    _add_network_arguments(add)
    _add_workload_arguments(add)
    add("-o", "--output-dir", default="projections", metavar="DIR",
        help="where the projection file and chart go (default: projections)")
    add("--format", choices=("text", "markdown"), default="text")


def _add_network_arguments(add) -> None:
    """The flags of the network a projection runs on (commbench.simulate.network_inputs)."""
    add("--link", metavar="RATE", help="each machine's network link, e.g. 25gbit, 100gbit "
        "(default: fitted from multi-machine microbench files)")
    add("--latency", metavar="T", help="latency between machines (default: the transport's, "
        f"else {network_inputs.DEFAULT_LATENCY['inter']})")
    add("--transport", metavar="NAME", help="what moves the bytes between machines: "
        "a stated --link reaches the share of its line rate this transport reaches in "
        f"published microbenchmarks (docs/simulate.md, \"Transports\"); one of "
        f"{', '.join(n for n, p in transports.PROFILES.items() if 'inter' in p.classes)} "
        f"(default: {transports.LINE_RATE})")
    add("--flow-cap", metavar="RATE", help="the network's cap on one TCP flow, as clouds "
        "set it (e.g. 5gbit): a socket transport then fills the link only with enough flows")
    add("--nccl-tests", metavar="FILES", help="nccl-tests output measured on your cluster "
        "(all_reduce_perf, sendrecv_perf, alltoall_perf; comma-separated): the links are "
        "fitted from it, size by size")
    add("--intra-link", metavar="RATE", help="between workers of one machine, e.g. 150GB/s "
        "(default: fitted from single-machine microbench files, else 150GB/s, NVLink class)")
    add("--intra-latency", metavar="T", help="latency inside a machine (default: the "
        f"transport's, else {network_inputs.DEFAULT_LATENCY['intra']})")
    add("--intra-transport", metavar="NAME", help="what moves the bytes inside a machine: "
        f"{', '.join(n for n, p in transports.PROFILES.items() if 'intra' in p.classes)} "
        f"(default: {transports.LINE_RATE})")


def _add_workload_arguments(add) -> None:
    """The flags of the workload and how its compute and overlap are taken."""
    add("--model", help="torchvision model or language model (lm-tiny, ...: its compute "
        "from a calibration run of it) (default: the runs', else resnet50)")
    add("--batch-size", type=positive_int, help="per worker (default: the runs', else 32)")
    add("--image-size", type=positive_int, help="(default: the runs', else 224)")
    add("--seq-len", type=positive_int, metavar="TOKENS", help="a language model's tokens "
        "per sequence (default: the runs', else the model's, as `commbench run`)")
    add("--img-sec", type=positive_float, metavar="X", help="one device's img/sec at this "
        "model and batch size, for hardware you do not have (e.g. 367: ResNet-50 FP32 on a "
        "V100)")
    add("--compute-from", choices=("one", "each"), default="one",
        help="one: the reference of the fewest workers measured, at every N (a device's "
        "own speed); each: each N's own in-job reference where measured (workers that "
        "share cores, e.g. this box) (default: one)")
    add("--collective", choices=("auto", "ring", "tree"), default="auto",
        help="allreduce algorithm: auto = NCCL's choice of ring or tree for GPUs, ring "
        "for gloo and MPI on CPUs (default: auto)")
    add("--overlap", default="1", metavar="X|fit",
        help="share of the communication a strategy overlaps with backward that really "
        "hides: 1 where communication has its own engine (NCCL on GPUs); `fit`: the share "
        "that meets the measured runs at the smallest multi-worker N (CPU workers share "
        "their cores with the transport) (default: 1)")


def main(args) -> int:
    from commbench.analysis import reading

    refuse_what_nccl_tests_replaces(args)
    workers = _workers(args.np, args.slow_ranks)
    runs, benches, notes = calibration_files.read(args.paths)
    for line in notes:
        print(f"commbench simulate: {line}", file=sys.stderr)
    out_dir = _output_dir(args.output_dir, runs)
    model, batch, image = calibrate.workload(args, [r.doc for r in runs])
    runs = [r for r in runs if calibrate.workload_of(r.doc) == (model, batch, image)]
    language.check(args, model, image, runs)
    strategy_flags.refuse_what_changes_nothing(args, [r.doc for r in runs])
    # the links first: a bad --nccl-tests file is said before a model is built
    found_links = network_inputs.network_from(args, calibrate.fit_microbench(
        [b.doc for b in benches], [b.path.name for b in benches]))
    net = found_links.network
    grads = language.gradients(model, image)
    computes = calibrate.compute_by_workers(args, runs, grads, batch)
    strategies = calibrate.strategies_to_project(args, runs)
    per_machine = args.per_machine or calibrate.workers_per_machine(runs)
    fp16 = args.fp16_allreduce  # every strategy; a run's or --compression's: its own
    on_gpu = args.img_sec is not None or any(
        (r.doc.get("environment") or {}).get("device") == "cuda" for r in runs)
    algorithms = (found_links.algorithms() or (("ring", "tree") if on_gpu else ("ring",))) \
        if args.collective == "auto" else (args.collective,)
    stragglers = [reading.stragglers_of(r.doc["config"]) or "none" for r in runs]
    slow = _slow_ranks(args, set(stragglers))
    alike = [r for r, s in zip(runs, stragglers) if s == slow]  # the measurements to set beside
    inputs = Inputs(language.per_step(model, batch, image), grads, net, per_machine, computes,
                    algorithms, 2.0 if fp16 else 4.0,
                    calibrate.measured_img_sec(alike, per_machine),
                    pipeline_bytes=_pipeline_bytes(on_gpu, runs), slow_ranks=slow,
                    codec=calibrate.codec_seconds(runs))
    overlap_note = calibrate.set_overlap(args.overlap, strategies, inputs)
    rows = project(strategies, workers, inputs)
    title = (f"PROJECTION: {language.described(model, batch, image)}, "
             f"{per_machine} workers per machine"
             + (f", {straggler.parse(slow).describe()} (stragglers on purpose)"
                if slow != "none" else ""))
    notes = (table.notes_of(inputs, strategies) + network_inputs.describe(found_links)
             + [overlap_note])
    checked = published.note(strategies) if on_gpu else None
    notes += [checked] if checked else []
    print(table.render(title, rows, notes, args.format, language.rate(model)))
    split = table.render_split(rows, calibrate.measured_split(runs, per_machine), args.format)
    if split:
        print(split)
    path = projection_file.write(out_dir, args, title, rows, notes, inputs,
                                 [str(r.path) for r in runs + benches], found_links.record(),
                                 {"model": model, "batch_size": batch, "image_size": image,
                                  "slow_ranks": slow, "link": args.link,
                                  **language.unit_of(model)})
    print(f"Projection: {path}\nChart: {_chart(path, title, rows, language.rate(model))}")
    return 0


def _chart(path: Path, title: str, rows, rate: str) -> Path:
    """The projection's chart, beside its file."""
    from commbench.plots import projection

    chart = path.with_suffix(".png")
    projection.save(projection.figure(title, rows, rate), chart)
    return chart


# The stated flags of each link class that a --nccl-tests fit of that class takes the
# place of: given with it, they would be silently ignored while the notes name the file.
REPLACED_BY_NCCL_TESTS = {"inter": ("link", "latency"), "intra": ("intra_link", "intra_latency")}


def refuse_what_nccl_tests_replaces(args) -> None:
    """Refuse --link/--latency when the nccl-tests files measured between machines, and
    --intra-link/--intra-latency when they measured inside one; a class they did not
    measure still takes its stated link."""
    if not args.nccl_tests:
        return
    for path in (p.strip() for p in args.nccl_tests.split(",") if p.strip()):
        measured = nccl_tests_output.parse(path)
        for name in REPLACED_BY_NCCL_TESTS[measured.link_class]:
            if getattr(args, name) is not None:
                flag = "--" + name.replace("_", "-")
                where = ("between machines" if measured.link_class == "inter"
                         else "inside a machine")
                raise UsageError(f"argument {flag}: --nccl-tests {path} measured the link "
                                 f"{where} and the projection takes it from there; drop "
                                 f"{flag} or that file")


def _pipeline_bytes(on_gpu: bool, runs) -> Optional[int]:
    """The pieces of commbench's hierarchical step between machines: on CPUs `auto` moves
    it over gloo, in pieces, unless its runs forced MPI; on GPUs NCCL takes whole
    buffers."""
    from commbench.comm.machine_averaging import PIPELINE_BYTES

    forced_mpi = any(r.doc["config"].get("cpu_transport") == "mpi" for r in runs
                     if r.doc["config"]["dist_optimizer"] == "hierarchical_neighbor_allreduce")
    return None if on_gpu or forced_mpi else PIPELINE_BYTES["gloo"]


def _output_dir(directory: str, runs) -> Path:
    out = Path(directory)
    if any(out.resolve() == r.path.parent.resolve() for r in runs):
        raise UsageError(f"argument --output-dir: {directory!r} holds measured results; "
                         f"projections go into a directory of their own")
    from commbench.result.store import ensure_writable

    try:
        return ensure_writable(out)
    except UsageError as e:
        raise UsageError(str(e).replace("--results-dir", "--output-dir")) from None


def _slow_ranks(args, found: set) -> str:
    """The stragglers to project: --slow-ranks, else the runs' (found) where they all had
    the same (none without runs)."""
    if args.slow_ranks:
        return args.slow_ranks
    return found.pop() if len(found) == 1 else "none"


def _workers(text: str, slow_ranks: Optional[str]) -> List[int]:
    """The worker counts of --np; a slowed rank (--slow-ranks) that none of them has is
    refused: the title would name a rank no projected row has."""
    try:
        workers = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        workers = []
    if not workers or workers[0] < 1:
        raise UsageError(f"argument --np: {text!r} is not a list of positive worker counts")
    if slow_ranks:
        straggler.check(slow_ranks, workers[-1],
                        f"the largest worker count projected (--np {workers[-1]})")
    return workers
