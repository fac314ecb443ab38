"""Calibration of a projection on what was measured: links fitted from microbench files
(commbench.simulate.network_inputs joins them with stated links and nccl-tests fits), and from
run files the workload, each worker count's compute, the strategies, the workers per
machine, the measured img/sec to compare with, and the share of overlapped
communication that hides (--overlap). The files are read, and checked for what it
needs of them, by commbench.simulate.calibration_files.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from commbench.config import compression
from commbench.errors import UsageError
from commbench.simulate import compute as compute_model
from commbench.simulate import costs, engines, language
from commbench.simulate.link_costs import Link, link_class
from commbench.simulate.project import Inputs, fit_overlap
from commbench.simulate.strategy import STRATEGIES, Strategy


def fit(points: List[tuple], source: str) -> Link:
    """α, β of time = messages·α + bytes·β by least squares over (messages, bytes,
    seconds) points; α is held at 0 when the free fit makes it negative."""
    x = np.array([[m, b] for m, b, _ in points], dtype=float)
    y = np.array([s for _, _, s in points], dtype=float)
    if len(points) < 3 or len(set(x[:, 1])) < 2:
        raise UsageError(f"cannot fit a link from {source}: it needs at least 3 sizes")
    (alpha, beta), *_ = np.linalg.lstsq(x, y, rcond=None)
    if alpha < 0:
        alpha, x = 0.0, x[:, 1:]
        beta = float(np.linalg.lstsq(x, y, rcond=None)[0][0])
    if beta <= 0:
        raise UsageError(f"cannot fit a link from {source}: time does not grow with size")
    predicted = x @ (np.array([alpha, beta]) if x.shape[1] == 2 else np.array([beta]))
    dof = max(len(y) - x.shape[1], 1)
    sigma2 = float(((y - predicted) ** 2).sum()) / dof
    covariance = sigma2 * np.linalg.pinv(x.T @ x)
    beta_se = math.sqrt(max(covariance[-1, -1], 0.0))
    return Link(float(alpha), float(beta), 1.96 * beta_se, source)


def fit_microbench(docs: List[dict], names: List[str]) -> Dict[Tuple[str, str], Link]:
    """Links fitted from microbench result documents, by (class, op): intra from
    single-machine files, inter from multi-machine ones (their intra part taken from
    the intra fit when there is one); allreduce and neighbor_allreduce rows apart.
    Each commbench row's time is modelled by commbench.simulate.costs."""
    found: Dict[Tuple[str, str], List[tuple]] = {}
    sources: Dict[Tuple[str, str], List[str]] = {}
    for doc, name in zip(docs, names):
        kind = link_class(doc)
        for row in doc["rows"]:
            if row.get("commbench") and row["op"] in costs.FITTED_OPS:
                found.setdefault((kind, row["op"]), []).append((doc, row))
                sources.setdefault((kind, row["op"]), [])
                if name not in sources[(kind, row["op"])]:
                    sources[(kind, row["op"])].append(name)
    links: Dict[Tuple[str, str], Link] = {}
    for key in sorted(found, key=lambda k: k[0] == "inter"):  # intra first
        kind, op = key
        points = [costs.fit_point(doc, row, kind, links.get(("intra", op)))
                  for doc, row in found[key]]
        links[key] = fit([p for p in points if p is not None],
                         f"{op} in microbench {', '.join(sources[key])}")
    return links


def set_overlap(text: str, strategies, inputs: Inputs) -> str:
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


def workload(args, docs) -> Tuple[str, int, int]:
    """(model, batch size, input size: pixels per side, or a language model's tokens per
    sequence) of the runs, chosen among them by the flags, else as the flags say."""
    seen = sorted({workload_of(d) for d in docs})
    chosen = [w for w in seen if (args.model in (None, w[0]) and args.batch_size in (None, w[1])
                                  and language.asked_size(args, w[0]) in (None, w[2]))]
    if len(chosen) > 1:
        listed = ", ".join(f"{m} batch {b} {i}{'tok' if language.is_language_model(m) else 'px'}"
                           for m, b, i in chosen)
        raise UsageError(f"the runs hold several workloads ({listed}); choose one with "
                         f"--model, --batch-size and --image-size (--seq-len)")
    if chosen:
        return chosen[0]
    model = args.model or "resnet50"
    if docs and args.img_sec is None and not language.is_language_model(model):
        raise UsageError("no run matches --model/--batch-size/--image-size (--seq-len); pass "
                         "--img-sec to project an image model on hardware you did not measure")
    return (model, args.batch_size or 32,
            language.asked_size(args, model) or language.default_size(model))


def workload_of(doc) -> Tuple[str, int, int]:
    config = doc["config"]
    return config["model"], config["batch_size"], language.input_size(config)


def compute_by_workers(args, runs, grads, batch) -> Dict[int, "compute_model.Compute"]:
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
        if batches:  # ranks may have timed different numbers of batches
            phases = samples.get("reference_phase_seconds") or []
            pooled[n][0].extend(v for rank in batches for it in rank for v in it)
            pooled[n][1].extend(v for rank in phases for row in rank for v in row)
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


def strategies_to_project(args, runs) -> List[Strategy]:
    if args.dist_optimizer:
        names = [s.strip() for s in args.dist_optimizer.split(",") if s.strip()]
        unknown = [s for s in names if s not in STRATEGIES]
        if unknown:
            raise UsageError(f"argument --dist-optimizer: no cost model for {unknown[0]!r}; "
                             f"modelled: {', '.join(STRATEGIES)}")
        version = getattr(args, "horovod_version", None) or engines.HOROVOD_DEFAULT
        engines.horovod(version)  # an unknown release is one line, before any work
        every = args.average_every if isinstance(args.average_every, list) else \
            [args.average_every]
        sent = compression.parse(getattr(args, "compression", None) or narrow_of(runs))
        return [Strategy(s, args.topology, not args.disable_dynamic_topology, args.atc_style,
                         args.hierarchical_allreduce and s == "horovod", version, tuple(every),
                         **(_powersgd(sent) if s == "allreduce" else {}),
                         narrow=sent.kind if sent.kind in compression.NARROW else "")
                for s in names]
    found = {strategy_of(r.doc) for r in runs} - {None}
    if found:
        return sorted(found, key=lambda s: (s.name == "none", s.label()))
    return [Strategy(s, args.topology, not args.disable_dynamic_topology, args.atc_style)
            for s in ("allreduce", "neighbor_allreduce", "hierarchical_neighbor_allreduce")]


def narrow_of(runs) -> str:
    """The 2-byte type every run's messages travel as, "none" where they do not all."""
    kinds = {sent_as(r.doc["config"]) for r in runs}
    return kinds.pop() if len(kinds) == 1 and kinds <= set(compression.NARROW) else "none"


def sent_as(config) -> str:
    """What a run's messages travel as: none, fp16 or bf16, or powersgd:RANK..."""
    return "fp16" if config.get("fp16_allreduce") else str(config.get("compression") or "none")


def strategy_of(doc) -> Optional[Strategy]:
    config = doc["config"]
    name = config["dist_optimizer"]
    if name not in STRATEGIES:
        return None
    every = config.get("average_every") or 8
    try:
        sent = compression.parse(sent_as(config))
    except ValueError:  # a garbled file: sent as the strategy sends it
        sent = compression.Compression()
    return Strategy(name, config.get("topology") or "exponential-2",
                    not config.get("disable_dynamic_topology"), bool(config.get("atc_style")),
                    name == "horovod" and bool(config.get("hierarchical_allreduce")),
                    every=tuple(every) if isinstance(every, list) else (int(every),),
                    outer_bf16=name == "diloco" and config.get("outer_dtype") == "bf16",
                    **_powersgd(sent), narrow=sent.kind if sent.kind in compression.NARROW else "")


def _powersgd(sent: compression.Compression) -> Dict[str, Any]:
    """A Strategy's PowerSGD fields for what its messages travel as (none but PowerSGD's)."""
    return {"powersgd": (sent.rank, sent.min_rate), "whole_steps": sent.start} \
        if sent.kind == "powersgd" else {}


def workers_per_machine(runs) -> int:
    if not runs:
        return 8
    largest = max(runs, key=lambda r: r.doc["summary"]["workers"]).doc.get("environment") or {}
    return int(largest.get("local_size") or largest.get("world_size") or 8)


def measured_img_sec(runs, per_machine) -> Dict[Tuple[str, int], Tuple[float, Optional[float]]]:
    """Mean total img/sec of the runs of each strategy and N laid out like the
    projection (their workers per machine), and its 95% interval over repeats (or the
    run's own over iterations)."""
    from commbench.result import metrics

    by: Dict[Tuple[str, int], List] = defaultdict(list)
    for r in runs:
        strategy, env = strategy_of(r.doc), r.doc.get("environment") or {}
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


def codec_seconds(runs) -> Dict[str, float]:
    """Per strategy, the compression codec's mean seconds per step where it held the step
    up (the measured split's `codec`), averaged over the runs that measured it."""
    by: Dict[str, List[float]] = defaultdict(list)
    for r in runs:
        strategy, split = strategy_of(r.doc), r.doc["summary"].get("step_split") or {}
        if strategy is not None and "codec" in split:
            by[strategy.label()].append(split["codec"]["mean"])
    return {label: float(np.mean(values)) for label, values in by.items()}


def measured_split(runs, per_machine) -> Dict[Tuple[str, int], Dict[str, float]]:
    """The measured step split (`summary.step_split`, mean seconds per step of each part)
    of each strategy and N laid out like the projection, averaged over repeats; runs
    without a split (older files, engines that time their own steps) add nothing."""
    by: Dict[Tuple[str, int], List[Dict[str, float]]] = defaultdict(list)
    for r in runs:
        strategy, env = strategy_of(r.doc), r.doc.get("environment") or {}
        split = r.doc["summary"].get("step_split")
        n = int(r.doc["summary"]["workers"])
        if strategy is None or not split or min(n, per_machine) != int(env.get("local_size") or n):
            continue
        by[(strategy.label(), n)].append({part: value["mean"] for part, value in split.items()})
    return {key: {part: float(np.mean([s[part] for s in splits])) for part in splits[0]
                  if all(part in s for s in splits)}  # parts a later commbench added
            for key, splits in by.items()}
