"""Charts of `commbench microbench` results: one figure per result file, two panels,
time per call versus size and bandwidth versus size, log-log.

Colour: the op; solid line and filled marker: commbench; dashed, hollow: the raw
primitives measured in the same job. Bandwidth is busbw for allreduce and the per-link
bandwidth for neighbor ops (both "how busy is one link", comparable across n; see
commbench.result.metrics), so each op's curves share one axis. matplotlib's object API, as in
commbench.plots.scaling: no global state, no display needed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, Union

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

LINESTYLES = ["--", ":", "-."]
MARKERS = "os^D"


def figure(doc: Dict[str, Any]) -> "Figure":
    from matplotlib.figure import Figure

    from commbench.microbench.results import title

    fig = Figure(figsize=(11.0, 4.6), layout="constrained")
    time_ax, bw_ax = fig.subplots(1, 2)
    ops = list(dict.fromkeys(row["op"] for row in doc["rows"]))
    for i, op in enumerate(ops):
        impls = list(dict.fromkeys(r["impl"] for r in doc["rows"] if r["op"] == op))
        raw = [impl for impl in impls if impl != "commbench"]
        for impl in impls:
            rows = sorted((r for r in doc["rows"] if r["op"] == op and r["impl"] == impl),
                          key=lambda r: r["bytes"])
            ours = impl == "commbench"
            style = dict(color=f"C{i % 10}", marker=MARKERS[i % len(MARKERS)], markersize=4,
                         linewidth=1.6 if ours else 1.1,
                         linestyle="-" if ours else LINESTYLES[raw.index(impl) % 3],
                         markerfacecolor=None if ours else "white",
                         label=f"{op}: {impl}")
            x = [r["bytes"] for r in rows]
            time_ax.plot(x, [r["summary"]["time"]["p50"] * 1e6 for r in rows], **style)
            bw = [(r["summary"].get("busbw") or r["summary"].get("link_bw") or 0) / 1e9
                  for r in rows]
            bw_ax.plot(x, bw, **style)
    for ax in (time_ax, bw_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size per rank (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    time_ax.set_yscale("log")
    time_ax.set_ylabel("time per call, p50 (µs)")
    time_ax.set_title("Time per call (p50 over ranks and calls)", fontsize=10)
    bw_ax.set_ylabel("GB/s")
    bw_ax.set_title("busbw (allreduce) / per-link bandwidth (neighbor ops)", fontsize=10)
    bw_ax.set_ylim(bottom=0)
    fig.suptitle(title(doc), fontsize=11)
    handles, labels = time_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(3, len(labels)),
               fontsize=8, frameon=False)
    return fig


def chart_name(result) -> str:
    """microbench-n<ranks>-<topology>-<result file stem>: unique per result file."""
    doc = result.doc
    slug = f"n{doc['summary'].get('world_size')}-{doc['config'].get('topology')}"
    return "microbench-" + re.sub(r"[^A-Za-z0-9._-]+", "_", f"{slug}-{Path(result.path).stem}")


def write(found: List[Any], out_dir: Union[str, Path], formats: Sequence[str] = ()) -> List[Path]:
    from commbench.plots.scaling import save_named

    return [path for result in found
            for path in save_named(figure(result.doc), out_dir, chart_name(result), formats)]
