"""`commbench simulate [PATH...]`: project img/sec, scaling efficiency and the time
of each step's parts to other worker counts, machine sizes and links.

Compute comes from the compute-only reference of the run files under PATH (or
--img-sec, one device's throughput); the network from microbench files under PATH
(or --link/--intra-link). Prints a table, writes a projection file (kind
"projection") and its chart into --output-dir, never among measured results.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from commbench.analysis import tables
from commbench.errors import UsageError
from commbench.microbench import results as microbench_results
from commbench.simulate import compute as compute_model
from commbench.simulate import network as network_model
from commbench.simulate.network import Network
from commbench.simulate.project import Inputs, Row, fit_overlap, project
from commbench.simulate.step import STRATEGIES, Strategy

DEFAULT_WORKERS = "1,2,4,8,16,32,64,128,256,512,1024"
KIND = "projection"


def add_arguments(parser) -> None:
    add = parser.add_argument
    add("paths", nargs="*", metavar="PATH", help="run and microbench result files or "
        "directories to calibrate on (runs: compute; microbench: links)")
    add("--np", default=DEFAULT_WORKERS, metavar="LIST",
        help=f"worker counts to project (default: {DEFAULT_WORKERS})")
    add("--gpus-per-machine", "--per-machine", dest="per_machine", type=int, metavar="N",
        help="workers per machine (default: as in the largest run, else 8)")
    add("--dist-optimizer", metavar="LIST", help="strategies, comma-separated (default: "
        "those of the runs, else allreduce,neighbor_allreduce,"
        "hierarchical_neighbor_allreduce); modelled: " + ", ".join(STRATEGIES))
    add("--topology", default="exponential-2", help="topology of decentralized strategies")
    add("--disable-dynamic-topology", action="store_true",
        help="the static topology every step instead of the dynamic one-peer schedule")
    add("--atc-style", action="store_true", help="adapt-then-combine (no overlap)")
    add("--fp16-allreduce", action="store_true", help="communication in float16 (default: "
        "as the runs, when all of them did)")
    add("--hierarchical-allreduce", action="store_true", help="horovod: allreduce inside "
        "each machine, then across machines, then back (HOROVOD_HIERARCHICAL_ALLREDUCE)")
    add("--link", metavar="RATE", help="each machine's network link, e.g. 25gbit, 100gbit "
        "(default: fitted from multi-machine microbench files)")
    add("--latency", default="5us", metavar="T", help="latency between machines (default: 5us)")
    add("--intra-link", metavar="RATE", help="between workers of one machine, e.g. 150GB/s "
        "(default: fitted from single-machine microbench files, else 150GB/s, NVLink class)")
    add("--intra-latency", default="1us", metavar="T",
        help="latency inside a machine (default: 1us)")
    add("--model", help="torchvision model (default: the runs', else resnet50)")
    add("--batch-size", type=int, help="per worker (default: the runs', else 32)")
    add("--image-size", type=int, help="(default: the runs', else 224)")
    add("--img-sec", type=float, metavar="X", help="one device's img/sec at this model and "
        "batch size, for hardware you do not have (e.g. 367: ResNet-50 FP32 on a V100)")
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
    add("-o", "--output-dir", default="projections", metavar="DIR",
        help="where the projection file and chart go (default: projections)")
    add("--format", choices=("text", "markdown"), default="text")


def main(args) -> int:
    from commbench.results import load_results

    found, warnings = load_results(args.paths)
    for line in warnings:
        print(f"commbench simulate: {line}", file=sys.stderr)
    runs = [r for r in found if r.kind == "run"]
    benches = [r for r in found
               if r.kind == microbench_results.KIND and isinstance(r.doc.get("rows"), list)]
    out_dir = _output_dir(args.output_dir, runs)
    model, batch, image = _workload(args, [r.doc for r in runs])
    runs = [r for r in runs if (r.doc["config"]["model"], r.doc["config"]["batch_size"],
                                r.doc["config"]["image_size"]) == (model, batch, image)]
    grads = compute_model.gradients(model, image)
    net = network_model.network_from(args, network_model.fit_microbench(
        [b.doc for b in benches], [b.path.name for b in benches]))
    computes = _computes(args, runs, grads, batch)
    strategies = _strategies(args, runs)
    workers = _workers(args.np)
    if args.per_machine is not None and args.per_machine < 1:
        raise UsageError("argument --gpus-per-machine: must be a positive integer")
    per_machine = args.per_machine or _per_machine(runs)
    fp16 = args.fp16_allreduce or bool(runs) and all(r.doc["config"].get("fp16_allreduce")
                                                     for r in runs)
    on_gpu = args.img_sec is not None or any(r.doc["environment"].get("device") == "cuda"
                                             for r in runs)
    algorithms = (("ring", "tree") if on_gpu else ("ring",)) if args.collective == "auto" \
        else (args.collective,)
    inputs = Inputs(batch, grads, net, per_machine, computes, algorithms,
                    2.0 if fp16 else 4.0, _measured(runs, per_machine))
    overlap_note = _overlap(args.overlap, strategies, inputs)
    rows = project(strategies, workers, inputs)
    title = (f"PROJECTION: {model}, batch {batch} per worker, {image}x{image} images, "
             f"{per_machine} workers per machine")
    notes = notes_of(inputs) + [overlap_note]
    print(render(title, rows, notes, args.format))
    path = _write(out_dir, args, title, rows, notes, inputs,
                  [str(r.path) for r in runs + benches])
    from commbench.plots import projection

    chart = path.with_suffix(".png")
    projection.save(projection.figure(title, rows), chart)
    print(f"Projection: {path}\nChart: {chart}")
    return 0


def _overlap(text: str, strategies, inputs: Inputs) -> str:
    """Set the inputs' overlap efficiency from --overlap; the note that says how."""
    if text != "fit":
        try:
            inputs.overlap = float(text)
        except ValueError:
            inputs.overlap = -1.0
        if not 0 <= inputs.overlap <= 1:
            raise UsageError(f"argument --overlap: {text!r} is neither a share in [0, 1] "
                             f"nor `fit`")
        return (f"overlap: {inputs.overlap:g} of the communication each schedule overlaps "
                f"with backward hides (stated).")
    smallest = min((n for _, n in inputs.measured if n > 1), default=None)
    fitted = fit_overlap(strategies, smallest, inputs) if smallest else {}
    if not fitted:
        raise UsageError("argument --overlap: fit needs measured runs at more than one "
                         "worker whose schedule overlaps communication")
    inputs.overlaps, inputs.overlap = fitted, float(np.mean(list(fitted.values())))
    each = ", ".join(f"{label} {value:.2f}" for label, value in fitted.items())
    return (f"overlap: the share of the communication each schedule overlaps with "
            f"backward that hides, fitted on the runs at N={smallest}: {each}; "
            f"{inputs.overlap:.2f} (their mean) for the others.")


def _output_dir(directory: str, runs) -> Path:
    out = Path(directory)
    if any(out.resolve() == r.path.parent.resolve() for r in runs):
        raise UsageError(f"argument --output-dir: {directory!r} holds measured results; "
                         f"projections go into a directory of their own")
    from commbench.results import ensure_writable

    try:
        return ensure_writable(out)
    except UsageError as e:
        raise UsageError(str(e).replace("--results-dir", "--output-dir")) from None


def _workload(args, docs) -> Tuple[str, int, int]:
    seen = sorted({(d["config"]["model"], d["config"]["batch_size"], d["config"]["image_size"])
                   for d in docs})
    chosen = [w for w in seen if (args.model in (None, w[0]) and args.batch_size in (None, w[1])
                                  and args.image_size in (None, w[2]))]
    if len(chosen) > 1:
        listed = ", ".join(f"{m} batch {b} {i}px" for m, b, i in chosen)
        raise UsageError(f"the runs hold several workloads ({listed}); choose one with "
                         f"--model, --batch-size and --image-size")
    if chosen:
        return chosen[0]
    if docs and args.img_sec is None:
        raise UsageError("no run matches --model/--batch-size/--image-size; pass --img-sec "
                         "to project hardware you did not measure")
    return args.model or "resnet50", args.batch_size or 32, args.image_size or 224


def _computes(args, runs, grads, batch) -> Dict[int, "compute_model.Compute"]:
    if args.img_sec is not None:
        if args.img_sec <= 0:
            raise UsageError("argument --img-sec: must be positive")
        return {1: compute_model.stated(args.img_sec, batch, grads.forward_share,
                                        f"stated: {args.img_sec:g} img/s per device")}
    pooled: Dict[int, List] = defaultdict(lambda: [[], [], []])  # samples, phases, files
    for r in runs:
        samples, n = r.doc.get("samples") or {}, int(r.doc["summary"]["workers"])
        batches = samples.get("reference_batch_seconds")
        if not batches and r.doc["config"]["dist_optimizer"] == "none":
            batches = samples.get("batch_seconds")
        if batches:
            pooled[n][0].extend(np.ravel(batches).tolist())
            pooled[n][1].extend(np.reshape(samples.get("reference_phase_seconds") or [],
                                           (-1,)).tolist())
            pooled[n][2].append(r.path.name)
    if not pooled:
        raise UsageError("no compute to project from: give run files with a compute-only "
                         "reference (commbench run or sweep), or --img-sec")
    computes = {n: compute_model.measured(s, p, grads.forward_share,
                                          f"reference of {len(f)} run(s) at N={n}")
                for n, (s, p, f) in pooled.items()}
    if args.compute_from == "one":
        fewest = min(computes)
        return {1: computes[fewest]}
    return computes


def _strategies(args, runs) -> List[Strategy]:
    if args.dist_optimizer:
        names = [s.strip() for s in args.dist_optimizer.split(",") if s.strip()]
        unknown = [s for s in names if s not in STRATEGIES]
        if unknown:
            raise UsageError(f"argument --dist-optimizer: no cost model for {unknown[0]!r}; "
                             f"modelled: {', '.join(STRATEGIES)}")
        return [Strategy(s, args.topology, not args.disable_dynamic_topology, args.atc_style,
                         args.hierarchical_allreduce and s == "horovod") for s in names]
    found = {strategy_of(r.doc) for r in runs} - {None}
    if found:
        return sorted(found, key=lambda s: (s.name == "none", s.label()))
    return [Strategy(s, args.topology, not args.disable_dynamic_topology, args.atc_style)
            for s in ("allreduce", "neighbor_allreduce", "hierarchical_neighbor_allreduce")]


def strategy_of(doc) -> Optional[Strategy]:
    config = doc["config"]
    name = config["dist_optimizer"]
    if name not in STRATEGIES:
        return None
    return Strategy(name, config.get("topology") or "exponential-2",
                    not config.get("disable_dynamic_topology"), bool(config.get("atc_style")),
                    name == "horovod" and bool(config.get("hierarchical_allreduce")))


def _workers(text: str) -> List[int]:
    try:
        workers = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        workers = []
    if not workers or workers[0] < 1:
        raise UsageError(f"argument --np: {text!r} is not a list of positive worker counts")
    return workers


def _per_machine(runs) -> int:
    if not runs:
        return 8
    largest = max(runs, key=lambda r: r.doc["summary"]["workers"]).doc["environment"]
    return int(largest.get("local_size") or largest.get("world_size") or 8)


def _measured(runs, per_machine) -> Dict[Tuple[str, int], Tuple[float, Optional[float]]]:
    """Mean total img/sec of the runs of each strategy and N laid out like the
    projection (their workers per machine), and its 95% interval over repeats (or the
    run's own over iterations)."""
    from commbench import metrics

    by: Dict[Tuple[str, int], List] = defaultdict(list)
    for r in runs:
        strategy, env = strategy_of(r.doc), r.doc["environment"]
        n = int(r.doc["summary"]["workers"])
        if strategy is None or min(n, per_machine) != int(env.get("local_size") or n):
            continue
        by[(strategy.label(), n)].append(r.doc["summary"]["total_img_sec"])
    measured = {}
    for key, totals in by.items():
        means = [t["mean"] for t in totals]
        ci = metrics.ci95_halfwidth(means) if len(means) > 1 else totals[0].get("ci95")
        measured[key] = (float(np.mean(means)), ci)
    return measured


HEADERS = ["strategy", "N", "machines", "img/sec", "band", "E(N)", "compute ms",
           "exposed ms", "hidden ms", "straggler ms", "with stragglers", "allreduce",
           "basis", "measured", "error"]


def _cells(row: Row) -> List[str]:
    def ms(v):
        return "-" if v is None else f"{v * 1e3:.1f}"

    error = row.error
    measured = "-" if row.measured is None else (
        f"{row.measured:.1f}" + (f" ±{row.measured_ci:.1f}" if row.measured_ci else ""))
    return [row.strategy, str(row.workers), str(row.machines), f"{row.img_sec:.1f}",
            f"{row.low:.0f}-{row.high:.0f}", f"{100 * row.efficiency:.1f}%",
            ms(row.step.compute), ms(row.step.exposed), ms(row.step.overlapped), ms(row.wait),
            "-" if row.with_stragglers is None else f"{row.with_stragglers:.1f}",
            row.step.algorithm, row.basis, measured,
            "-" if error is None else f"{100 * error:+.1f}%"]


def render(title: str, rows: List[Row], notes: List[str], fmt: str) -> str:
    body = tables.render(HEADERS, [_cells(r) for r in rows], "lrrrrrrrrrrllrr", fmt)
    return f"{tables.heading(title, fmt)}\n\n{body}\n{tables.notes(notes, fmt)}"


def notes_of(inputs: Inputs) -> List[str]:
    net, c = inputs.network, inputs.compute_at(1)
    return [
        "A PROJECTION by commbench's cost model, not a measurement.",
        f"compute: {c.source}; {c.seconds * 1e3:.1f} ms per batch (forward "
        f"{c.forward * 1e3:.1f}, backward {c.backward * 1e3:.1f}, optimizer "
        f"{c.optimizer * 1e3:.1f}); gradients {inputs.gradients.total / 1e6:.1f} MB"
        + (", sent as float16." if inputs.bytes_per_element == 2 else "."),
        f"links: between machines {net.inter.describe()}; inside a machine "
        f"{net.intra.describe()}." + ("" if net.for_exchange() == Network(net.intra, net.inter)
                                     else f" Neighbor exchanges: between machines "
                                     f"{net.for_exchange().inter.describe()}; inside "
                                     f"{net.for_exchange().intra.describe()}."),
        "band: the projection with compute and links at the slow and fast ends of their "
        "calibration's 95% intervals. E(N): img/sec / (N x one worker's compute-only "
        "img/sec).",
        "basis: measured (a run at this N and layout), within (up to the largest N "
        "measured for the strategy), extrapolated (beyond it), unvalidated (never "
        "measured: the model alone).",
        "with stragglers: each step also waits for the slowest worker it depends on "
        "(all for allreduce, in-neighbors for neighbor averaging), drawn from the measured "
        "per-batch times; a few hundred batches of one machine cannot show a large "
        "cluster's tail.",
    ]


def _write(out_dir: Path, args, title: str, rows: List[Row], notes: List[str],
           inputs: Inputs, files: List[str]) -> Path:
    from commbench.results import new_document, write_result

    doc = new_document(KIND)
    net = inputs.network
    doc.update(
        title=title,
        notes=notes,
        summary={"strategies": list(dict.fromkeys(r.strategy for r in rows)),
                 "workers": sorted({r.workers for r in rows}),
                 "measured_points": sum(r.measured is not None for r in rows)},
        config={k: v for k, v in vars(args).items() if k not in ("run_flags",)},
        inputs={"files": files, "gradient_bytes": inputs.gradients.total,
                "per_machine": inputs.per_machine, "algorithms": list(inputs.algorithms),
                "links": {name: link and vars(link) for name, link in
                          (("intra", net.intra), ("inter", net.inter),
                           ("exchange_intra", net.exchange_intra),
                           ("exchange_inter", net.exchange_inter))},
                "compute": {str(n): {"forward": c.forward, "backward": c.backward,
                                     "optimizer": c.optimizer, "mean_ci": c.mean_ci,
                                     "source": c.source} for n, c in inputs.compute.items()}},
        rows=[{"strategy": r.strategy, "workers": r.workers, "machines": r.machines,
               "img_sec": r.img_sec, "band": [r.low, r.high], "efficiency": r.efficiency,
               "step": {"compute": r.step.compute, "exposed": r.step.exposed,
                        "overlapped": r.step.overlapped, "straggler_wait": r.wait,
                        "allreduce": r.step.algorithm},
               "img_sec_with_stragglers": r.with_stragglers, "basis": r.basis,
               "measured": r.measured, "measured_ci": r.measured_ci} for r in rows])
    json.dumps(doc, allow_nan=False)  # fail here, not half-written
    return write_result(out_dir, doc, f"projection-{title.split(',')[0].split()[-1]}")


def rows_of(doc) -> List[Row]:
    """The rows of a projection file, as `project` made them."""
    from commbench.simulate.step import StepTime

    return [Row(r["strategy"], r["workers"], r["machines"], r["img_sec"], *r["band"],
                r["efficiency"], StepTime(r["step"]["compute"], r["step"]["exposed"],
                                          r["step"]["overlapped"], 0.0, r["step"]["allreduce"]),
                r["img_sec_with_stragglers"], r["step"]["straggler_wait"], r["basis"],
                r["measured"], r["measured_ci"]) for r in doc["rows"]]


def load(paths) -> List:
    """Every projection file under paths (commbench.results.Result objects)."""
    from commbench.results import load_results

    found, _ = load_results(paths)
    return [r for r in found if r.kind == KIND and isinstance(r.doc.get("rows"), list)]


def render_files(found, fmt: str) -> str:
    """`commbench report` of projection files: their tables, labelled as projections."""
    return "\n".join(render(r.doc["title"], rows_of(r.doc), r.doc.get("notes") or [], fmt)
                     for r in found)


def chart_files(found, out_dir: Path, formats) -> List[Path]:
    """`commbench plot` of projection files: one chart each, named after the file."""
    from commbench.plots import projection

    written = []
    for r in found:
        paths = [Path(out_dir) / f"{r.path.stem}.{ext}" for ext in dict.fromkeys(["png", *formats])]
        for path in paths:
            projection.save(projection.figure(r.doc["title"], rows_of(r.doc)), path)
        written += paths
    return written
