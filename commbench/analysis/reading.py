"""Reading speed results (kind "run") into runs (commbench.analysis.runs): the fields
a reader computes with, checked before it does, and what a run's file says of its
group and series. commbench.analysis.reader reads the files and hands each kind to
its reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from commbench.job import straggler
from commbench.result import metrics
from commbench.timing import step_split
from commbench.analysis import validate
from commbench.analysis.runs import GroupKey, Run, Series
from commbench.analysis.validate import MAYBE as _MAYBE
from commbench.analysis.validate import SECONDS_FLOOR, items, number, section, text, whole
from commbench.result.store import Result

KIND = "run"

# Where a run's steps went and what it sent: the same in speed and accuracy results.
SPLIT_AND_WIRE_FIELDS = (
    section("summary.step_split", **_MAYBE),
    *(section(f"summary.step_split.{part}", **(_MAYBE if part in step_split.LATER else {}))
      for part in step_split.PARTS),
    number("summary.step_split.*.mean"),
    section("summary.wire", **_MAYBE), validate.flag("summary.wire_unrecorded", **_MAYBE),
    *(number(f"summary.wire.{key}", 0, **_MAYBE)
      for key in ("bytes_per_step", "messages_per_step", "bytes_per_image")),
)

# What read_run computes with. A diverged run's loss and consensus distance may be NaN
# or infinite (shown as such); its img/sec, times and counts may not.
RUN_FIELDS = (
    text("config.model"), whole("config.batch_size", 1), whole("config.image_size", 1),
    whole("config.num_classes", 1, optional=True),
    whole("config.num_batches_per_iter", 1, optional=True),
    whole("summary.workers", 1),
    section("summary.total_img_sec"), number("summary.total_img_sec.mean", 0, above=True),
    number("summary.total_img_sec.ci95", 0, **_MAYBE),
    section("summary.latency_seconds_per_batch"),
    number("summary.latency_seconds_per_batch.*", 0),
    number("summary.compute_only_img_sec_per_worker", 0, above=True, **_MAYBE),
    number("summary.efficiency_in_job", 0, **_MAYBE),
    number("summary.efficiency_in_job_ci95", 0, **_MAYBE),
    number("summary.communication_overhead", high=1, **_MAYBE),
    number("summary.communication_overhead_ci95", 0, **_MAYBE),
    number("summary.reference_overlap", **_MAYBE), number("summary.reference_drift", **_MAYBE),
    number("summary.final_consensus_distance", finite=False, **_MAYBE),
    validate.load("summary.oversubscribed", **_MAYBE),
    *SPLIT_AND_WIRE_FIELDS,
    section("summary.diverged", **_MAYBE), whole("summary.diverged.step", 1),
    whole("summary.diverged.rank", 0),
    section("samples", **_MAYBE),
    items("samples.iteration_seconds", **_MAYBE), items("samples.iteration_seconds.*"),
    number("samples.iteration_seconds.*.*", SECONDS_FLOOR),
    items("samples.batch_seconds", **_MAYBE), items("samples.batch_seconds.*"),
    items("samples.batch_seconds.*.*"), number("samples.batch_seconds.*.*.*", 0),
    items("samples.consensus_distance", **_MAYBE),
    number("samples.consensus_distance.*", finite=False),
    section("strategy", **_MAYBE), section("environment", **_MAYBE),
    items("environment.hostnames", **_MAYBE), whole("environment.cpu_count", 1, **_MAYBE),
)


def usable(found: Sequence[Result], fields: Sequence[validate.Field] = RUN_FIELDS,
           check: Optional[Callable[[Dict[str, Any]], None]] = None
           ) -> Tuple[List[Run], List[str]]:
    """The runs of the `run` results found that pass fields (RUN_FIELDS: what read_run
    uses; a reader that uses more gives more) and `check` (what fields cannot say: it
    raises validate.Invalid), and one line per result skipped."""
    def read(result: Result) -> Run:
        if check:
            check(result.doc)
        return read_run(result.path, result.doc)

    return validate.usable(list(found), KIND, fields, read)


def read_run(path: Path, doc: Dict[str, Any]) -> Run:
    """The run of a document that passed RUN_FIELDS."""
    config, summary = doc["config"], doc["summary"]
    samples = doc.get("samples") or {}
    # A language model's input size is its sequence length, and each sequence counts
    # its tokens (summary.unit).
    tokens = config.get("seq_len")
    key = GroupKey(str(config["model"]), int(config["batch_size"]),
                   int(tokens or config["image_size"]), int(config.get("num_classes", 1000)),
                   *machine_of(doc), str(config.get("tag") or ""))
    total = summary["total_img_sec"]
    totals: Tuple[float, ...] = ()
    if samples.get("iteration_seconds"):
        images = key.batch_size * int(config["num_batches_per_iter"]) * int(tokens or 1)
        totals = tuple(metrics.total_throughput(images, samples["iteration_seconds"]).tolist())
    consensus = samples.get("consensus_distance") or ()
    crowded = oversubscribed(doc)
    return Run(
        path=Path(path), doc=doc, key=key, series=series_of(doc), workers=int(summary["workers"]),
        total=float(total["mean"]), total_ci=_float(total.get("ci95")), totals=totals,
        batch_seconds=tuple(float(v) for rank in samples.get("batch_seconds") or ()
                            for iteration in rank for v in iteration),
        latency={k: float(v) for k, v in summary["latency_seconds_per_batch"].items()},
        compute_only=_float(summary.get("compute_only_img_sec_per_worker")),
        efficiency_in_job=_float(summary.get("efficiency_in_job")),
        efficiency_in_job_ci=_float(summary.get("efficiency_in_job_ci95")),
        overhead=_float(summary.get("communication_overhead")),
        overhead_ci=_float(summary.get("communication_overhead_ci95")),
        consensus=tuple(float(c) for c in consensus),
        final_consensus=_float(summary.get("final_consensus_distance")),
        oversubscribed=crowded,
        flags=tuple(metrics.trust_flags({**summary, "oversubscribed": crowded})),
        diverged=summary.get("diverged"))


def oversubscribed(doc: Dict[str, Any]) -> bool:
    """More CPU workers on a machine than it has cores, as the run recorded it, or
    for results from before it did, from their hostnames and core counts."""
    summary, env = doc["summary"], doc.get("environment") or {}
    if "oversubscribed" in summary:
        return bool(summary["oversubscribed"])
    hosts = env.get("hostnames") or []
    cores = env.get("cpu_count")
    if env.get("device") != "cpu" or not hosts or not cores:
        return False
    return max(hosts.count(h) for h in hosts) > cores


def machine_of(doc: Dict[str, Any]) -> Tuple[str, str, str, str, str, str]:
    """Where and in which number format a result ran, as every kind's group key spells
    it: precision, device, backend, network, stragglers made on purpose (--slow-ranks)
    and hardware (the GPU's name, else the CPU's: results from different machines
    never pool)."""
    config, env = doc["config"], doc.get("environment") or {}
    device = str(env.get("device") or ("cpu" if config.get("no_cuda") else "unknown"))
    hardware = env.get("gpu") if device == "cuda" else env.get("cpu")
    return (precision_of(config), device, str(env.get("backend") or "unknown"),
            network_of(env), stragglers_of(config), str(hardware or "unknown"))


def stragglers_of(config: Dict[str, Any]) -> str:
    """The --slow-ranks a run was given, as the flag records it; "" for none (and for
    results from before the flag)."""
    given = config.get("slow_ranks") or "none"
    try:
        slow = straggler.parse(str(given))
    except ValueError:
        raise validate.Invalid("config.slow_ranks", f"is {validate.shown(given)}, not "
                               "--slow-ranks' none or RANKS:FACTOR[@P]") from None
    return str(slow) if slow.on else ""


def precision_of(config: Dict[str, Any]) -> str:
    """The compute's number format. What the messages travel as is the strategy's
    variant (variant_of), so compressed and plain runs share a chart; results from
    before --compression say it here (fp16-allreduce)."""
    amp = config.get("amp") or "off"
    compute = "fp32" if amp == "off" else f"amp-{amp}"
    if not config.get("fp16_allreduce") or "compression" in config:
        return compute
    return "fp16-allreduce" if compute == "fp32" else f"{compute}+fp16-allreduce"


def network_of(env: Dict[str, Any]) -> str:
    """The network runs must share to be compared: '' for real machines, else the
    emulated cluster's link rate, and the machines with a rate of their own (uneven
    links: "1gbit (m3 at 100mbit)")."""
    found = env.get("emulated_network")
    if not isinstance(found, dict):
        return ""
    own = found.get("link_of")
    uneven = ", ".join(f"{m} at {rate}" for m, rate in own.items()) \
        if isinstance(own, dict) else ""
    return str(found.get("link")) + (f" ({uneven})" if uneven else "")


def series_of(doc: Dict[str, Any]) -> Series:
    """The strategy and the topology settings its plugin recorded. Run flags such as
    --topology are not consulted: a strategy that ignores them (`none`) records none.
    Facts that vary with the worker count (spectral gap, number of machines) would
    split a series into single points, so only settings chosen by the user count."""
    config, strategy = doc["config"], doc.get("strategy") or {}
    name = str(strategy.get("name") or config["dist_optimizer"])
    dynamic = strategy.get("dynamic")
    if isinstance(dynamic, bool):
        dynamic = "dynamic" if dynamic else "static"
    machines = ""
    if "machine_size" in strategy and config.get("machine_size"):
        machines = ranks_per_machine(config["machine_size"])
    elif network_of(doc.get("environment") or {}):  # a layout the user chose by -H
        machines = ranks_per_machine(doc["environment"].get("machine_size") or "uneven")
    return Series(name, str(strategy.get("topology") or ""), str(dynamic or ""),
                  str(strategy.get("style") or "").upper(), machines, variant_of(strategy))


def ranks_per_machine(size: Any) -> str:
    return f"{size} rank{'' if size == 1 else 's'}/machine"


def variant_of(strategy: Dict[str, Any]) -> str:
    """The plugin options a strategy recorded that change what it runs, so runs with and
    without them are never pooled."""
    found = []
    if strategy.get("compression", "none") != "none":
        found.append(str(strategy["compression"]))
    if strategy.get("broadcast_buffers") is False:
        found.append("own BatchNorm statistics")
    if strategy.get("op") == "adasum":
        found.append("Adasum")
    if strategy.get("hierarchical_allreduce"):
        found.append("hierarchical allreduce")
    if "average_every" in strategy:  # local_sgd's and diloco's meetings
        every = strategy["average_every"]
        found.append(f"H={','.join(map(str, every)) if isinstance(every, list) else every}")
    if strategy.get("local_warmup_steps"):
        found.append(f"{strategy['local_warmup_steps']} warm-up steps")
    if "outer_lr" in strategy:
        found.append(f"outer lr {strategy['outer_lr']:g}, momentum "
                     f"{strategy['outer_momentum']:g}")
    if strategy.get("outer_dtype") == "bf16":
        found.append("bf16 pseudo-gradients")
    return ", ".join(found)


def _float(value) -> Optional[float]:
    return None if value is None else float(value)
