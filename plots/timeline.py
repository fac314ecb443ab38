"""A picture of a `--timeline` trace: for the last few steps, each rank's compute track
(forward, backward, optimizer; waits for communication in red) above its communication
track (each piece from posting to completion), and a dashed line where a failure of
--fail fired among them. Perfetto shows the same file
interactively; this is the still image for reports and the README."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List

from commbench.timing.failure_track import CATEGORY as FAILURE

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

COLORS = {"forward": "#4c72b0", "backward": "#55a868", "optimizer": "#8172b2",
          "post": "#dd8452", "wait": "#c44e52", "comm": "#937860"}
LABELS = {"forward": "forward", "backward": "backward", "optimizer": "optimizer",
          "post": "posting communication", "wait": "waiting for communication",
          "comm": "communication piece (posted to complete)"}


def figure(trace: Dict[str, Any], steps: int = 3) -> "Figure":
    """The chart of the last `steps` steps of every rank in trace (the file's JSON)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") != FAILURE]
    last = max(e["args"]["step"] for e in spans)
    shown = [e for e in spans if e["args"]["step"] > last - steps]
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("name") == "process_name" and e["pid"] in {s["pid"] for s in spans}}
    ranks = sorted(names)
    start, end = min(e["ts"] for e in shown), max(e["ts"] + e["dur"] for e in shown)
    fig = Figure(figsize=(10, 0.9 + 0.75 * len(ranks)), layout="constrained")
    ax = fig.subplots()
    rows: List[str] = []
    for rank in ranks:
        for track, kinds in (("compute", ("forward", "backward", "optimizer", "post", "wait")),
                             ("communication", ("comm",))):
            y = len(rows)
            rows.append(f"{names[rank]} {track}")
            for kind in kinds:
                bars = [((e["ts"] - start) / 1e3, e["dur"] / 1e3) for e in shown
                        if e["pid"] == rank and e["cat"] == kind]
                # pieces that overlap each other share the row, drawn half height
                height = 0.4 if kind == "comm" else 0.8
                ax.broken_barh(bars, (y - height / 2, height), color=COLORS[kind],
                               alpha=0.75 if kind == "comm" else 1.0, linewidth=0)
        for e in shown:
            if e["pid"] == rank and e["cat"] == "step":
                ax.axvline((e["ts"] - start) / 1e3, color="0.8", linewidth=0.6, zorder=0)
    for e in trace["traceEvents"]:  # --fail's failures within the steps drawn
        if e.get("ph") == "i" and e.get("cat") == FAILURE and start <= e["ts"] <= end:
            ax.axvline((e["ts"] - start) / 1e3, color="black", linestyle="--", linewidth=1)
            ax.annotate(e["name"], ((e["ts"] - start) / 1e3, 0), xytext=(3, 0),
                        textcoords="offset points", fontsize=7, va="top", rotation=90)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds (clocks aligned to rank 0's; grey lines: step starts)")
    ax.set_title(f"Timeline of the last {steps} measured steps", fontsize=11)
    fig.legend(handles=[Patch(color=COLORS[k], label=LABELS[k]) for k in COLORS],
               loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return fig
