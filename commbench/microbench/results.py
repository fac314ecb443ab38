"""`commbench microbench` result files: their schema, reading them back, and the
tables `commbench report` renders of them. Pure functions of the files, no torch.

Result document (kind "microbench"), besides the common header of commbench.result.store:
    config       the flags (ops, sizes, iterations, topology settings, ...)
    environment  as for runs
    rows         one per (op, size, implementation): op, impl, commbench (bool),
                 transport (commbench rows: what carried the call at this size,
                 gloo, mpi or nccl; null where the engine decides), bytes, count,
                 seconds [rank][call], bytes_sent/bytes_received (mean
                 per rank and call), wrong (commbench rows) and summary: time
                 {mean,p50,p99}, algbw, busbw (allreduce), link_bw (neighbor ops),
                 ratio_to_raw {impl: median of our time / its, call by call}
                 (commbench rows); with --compression (config.compression),
                 wire_fraction (bytes sent per float32 byte) and algbw_sent,
                 busbw_sent, link_bw_sent (the same figures in bytes actually
                 sent; algbw, busbw, link_bw count the float32 payload); on an
                 emulated cluster nic_bw (bytes that left a machine's interface
                 per second, mean over machines) and
                 link_fraction (nic_bw / configured rate)
    summary      world_size, sizes, ops, wrong (total)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from commbench.analysis import tables, validate
from commbench.analysis.validate import MAYBE as _MAYBE
from commbench.analysis.validate import items, number, section, text, whole
from commbench.microbench.link import ABOVE_RATE, SLOW_FRACTION, flag
from commbench.result.store import to_json

KIND = "microbench"

# What the tables, the charts and `simulate`'s link fits compute with.
FIELDS = (
    section("config"), text("config.topology", **_MAYBE),
    section("summary"), whole("summary.world_size", 1), section("environment", **_MAYBE),
    items("environment.hostnames", **_MAYBE), text("environment.hostnames.*"),
    items("rows"), section("rows.*"), text("rows.*.op"), text("rows.*.impl"),
    whole("rows.*.bytes", 0), section("rows.*.summary"), section("rows.*.summary.time"),
    number("rows.*.summary.time.mean", 0), number("rows.*.summary.time.p50", 0),
    number("rows.*.summary.time.p99", 0),
    number("rows.*.summary.algbw", 0, **_MAYBE), number("rows.*.summary.busbw", 0, **_MAYBE),
    number("rows.*.summary.link_bw", 0, **_MAYBE),
    number("rows.*.summary.link_fraction", 0, **_MAYBE),
    section("rows.*.summary.ratio_to_raw", **_MAYBE),
    number("rows.*.summary.ratio_to_raw.*", 0),
    number("rows.*.bytes_sent", 0), number("rows.*.bytes_received", 0),
    whole("rows.*.wrong", 0, **_MAYBE),
)


def usable(found: List[Any], check: Optional[Callable[[Dict[str, Any]], None]] = None
           ) -> Tuple[List[Any], List[str]]:
    """The microbench results of found that pass FIELDS, check_machines and `check`
    (a reader's own: it raises validate.Invalid), and one line per other."""
    def read(result):
        check_machines(result.doc)
        if check:
            check(result.doc)
        return result

    return validate.usable(found, KIND, FIELDS, read)


def check_machines(doc: Dict[str, Any]) -> None:
    """Refuse more machines than ranks: a file no reader can lay out."""
    hosts = (doc.get("environment") or {}).get("hostnames") or []
    found, ranks = len(set(hosts)), doc["summary"]["world_size"]
    if found > ranks:
        raise validate.Invalid("environment.hostnames", f"names {found} machines for "
                               f"{ranks} ranks (summary.world_size)")


def title(doc: Dict[str, Any]) -> str:
    config, env = doc["config"], doc.get("environment") or {}
    n = doc["summary"].get("world_size")
    schedule = "static" if config.get("disable_dynamic_topology") else "dynamic one-peer"
    parts = [f"microbench, {n} ranks", f"{config.get('topology')} ({schedule})"]
    if config.get("machine_size"):
        parts.append(f"{config['machine_size']} ranks/machine")
    hardware = env.get("gpu") or env.get("cpu") or "?"
    parts.append(f"{env.get('backend', '?')} on {env.get('device', '?')} ({hardware})")
    if config.get("compression") not in (None, "none"):
        parts.append(f"--compression {config['compression']} (bandwidths in fp32-equivalent "
                     "bytes)")
    if config.get("tag"):
        parts.append(f"tag {config['tag']}")
    return ", ".join(parts)


TABLE_HEADERS = ["op", "impl", "bytes", "time us", "p50 us", "p99 us", "algbw GB/s",
                 "busbw GB/s", "link GB/s", "sent B/rank", "recv B/rank", "#wrong", "x raw",
                 "x rate"]
TABLE_FIELDS = ("op", "impl", "bytes", "time_mean_s", "time_p50_s", "time_p99_s",
                "algbw", "busbw", "link_bw", "bytes_sent", "bytes_received", "wrong",
                "ratio_to_raw", "link_fraction")
NOTES = [
    "time: seconds per call pooled over ranks and calls (mean, p50, p99); each call "
    "after a barrier, on data reset outside the timed region.",
    "algbw = bytes / mean time; busbw = algbw x 2(n-1)/n for allreduce (nccl-tests); "
    "link = bytes / mean time for neighbor ops (links run concurrently).",
    "sent/recv: nominal bytes per rank and call (ring allreduce 2(n-1)/n x S; neighbor "
    "exchange out/in-degree x S), times the wire type's share under --compression. "
    "x raw: the median over ranks and calls of commbench's "
    "time / the raw primitive's in the same call, one ratio per raw row in the order "
    "listed.",
    "x rate (emulated clusters): bytes that left each machine's interface per second, "
    f"headers included, / the link's configured rate; (slow): below {SLOW_FRACTION}; "
    f"(burst): above {ABOVE_RATE}, a call short enough to pass within the rate limiter's "
    "burst, not a figure of the link.",
]


def impl_label(row: Dict[str, Any]) -> str:
    """The implementation, and for commbench's own row what carried it at this size."""
    transport = row.get("transport")
    return f"{row['impl']} ({transport})" if transport else row["impl"]


def record(row: Dict[str, Any]) -> Dict[str, Any]:
    s = row["summary"]
    return {"op": row["op"], "impl": row["impl"], "transport": row.get("transport"),
            "bytes": row["bytes"],
            "time_mean_s": s["time"]["mean"], "time_p50_s": s["time"]["p50"],
            "time_p99_s": s["time"]["p99"], "algbw": s.get("algbw"), "busbw": s.get("busbw"),
            "link_bw": s.get("link_bw"), "bytes_sent": row.get("bytes_sent"),
            "bytes_received": row.get("bytes_received"), "wrong": row.get("wrong"),
            "ratio_to_raw": s.get("ratio_to_raw"), "link_fraction": s.get("link_fraction")}


def _cells(r: Dict[str, Any]) -> List[str]:
    def gb(v):
        return "-" if v is None else f"{v / 1e9:.3f}"

    ratios = r["ratio_to_raw"] or {}
    return [r["op"], impl_label(r), str(r["bytes"]), f"{r['time_mean_s'] * 1e6:.1f}",
            f"{r['time_p50_s'] * 1e6:.1f}", f"{r['time_p99_s'] * 1e6:.1f}", gb(r["algbw"]),
            gb(r["busbw"]), gb(r["link_bw"]), f"{r['bytes_sent']:.0f}",
            f"{r['bytes_received']:.0f}", "-" if r["wrong"] is None else str(r["wrong"]),
            " ".join(f"{v:.2f}" for v in ratios.values()) or "-", flag(r["link_fraction"])]


def render(found: List[Any], fmt: str = "text") -> str:
    """Tables of microbench results (commbench report), one per result file."""
    if fmt == "json":
        return to_json({"microbench": [
            {"title": title(r.doc), "file": str(r.path),
             "rows": [record(row) for row in r.doc["rows"]]} for r in found]}, indent=1) + "\n"
    if fmt == "csv":
        rows = [[title(r.doc)] + [to_json(v) if isinstance(v, dict) else v
                                  for v in record(row).values()]
                for r in found for row in r.doc["rows"]]
        return tables.csv_text(["title", *TABLE_FIELDS], rows)
    parts = []
    for r in found:
        body = tables.render(TABLE_HEADERS, [_cells(record(row)) for row in r.doc["rows"]],
                             "llrrrrrrrrrrrr", fmt)
        parts.append(f"{tables.heading(title(r.doc), fmt)}\n\n{body}")
    return "\n".join(parts) + "\n" + tables.notes(NOTES, fmt)
