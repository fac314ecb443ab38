"""The chart of a projection (commbench simulate): projected total img/sec and scaling
efficiency versus workers, dashed, with the calibration's band shaded and the straggler
variant dotted; measured points on top as markers with their 95% intervals; worker
counts beyond the largest measured one greyed as extrapolation. Also the charts of
projection files for `commbench plot`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from commbench.simulate.project import Row

COLORS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7")


def figure(title: str, rows: List["Row"], rate: str = "img/sec") -> "Figure":
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.0, 4.8), layout="constrained")
    speed, efficiency = fig.subplots(1, 2)
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    for color, name in zip(COLORS * 4, strategies):
        mine = [r for r in rows if r.strategy == name]
        n = [r.workers for r in mine]
        speed.plot(n, [r.img_sec for r in mine], "--", color=color, label=f"{name} (projected)")
        speed.fill_between(n, [r.low for r in mine], [r.high for r in mine], color=color,
                           alpha=0.15, linewidth=0)
        efficiency.plot(n, [100 * r.efficiency for r in mine], "--", color=color)
        slowed = [(r.workers, r.with_stragglers) for r in mine if r.with_stragglers]
        if slowed:
            speed.plot(*zip(*slowed), ":", color=color, linewidth=1,
                       label=f"{name} (projected, with stragglers)")
        measured = [r for r in mine if r.measured is not None]
        if measured:
            speed.errorbar([r.workers for r in measured], [r.measured for r in measured],
                           yerr=[r.measured_ci or 0 for r in measured], fmt="o", color=color,
                           capsize=3, label=f"{name} (measured)")
            single = mine[0].img_sec / mine[0].efficiency / mine[0].workers
            efficiency.plot([r.workers for r in measured],
                            [100 * r.measured / (r.workers * single) for r in measured], "o",
                            color=color)
        beyond = [r.workers for r in mine if r.basis == "extrapolated"]
        if beyond:
            for ax in (speed, efficiency):
                ax.axvspan(min(beyond), max(beyond), color="0.92", zorder=0)
    workers = sorted({r.workers for r in rows})
    ideal = [n * rows[0].img_sec / rows[0].efficiency / rows[0].workers for n in workers]
    speed.plot(workers, ideal, "-", color="0.6", linewidth=0.8, label="linear (compute only)")
    for ax in (speed, efficiency):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.grid(True, which="both", alpha=0.3)
    if workers[-1] / workers[0] >= 8:
        speed.set_yscale("log")
    speed.set_ylabel(f"total {rate}")
    efficiency.set_ylabel("scaling efficiency E(N) %")
    efficiency.set_ylim(0, 110)
    speed.set_title("throughput (dashed: projected; grey band: extrapolated)", fontsize=9)
    efficiency.set_title("efficiency versus one worker's compute", fontsize=9)
    import textwrap

    from commbench.simulate.answer import runs_of, verdicts

    answer = runs_of(verdicts(rows))
    answer = textwrap.fill(f"fastest (projected): {answer}", 150) if answer else ""
    fig.suptitle(f"{title}\n{answer}" if answer else title, fontsize=10)
    fig.legend(*speed.get_legend_handles_labels(), loc="outside lower center", ncol=2,
               fontsize=8, frameon=False)
    return fig


def save(fig: "Figure", path) -> None:
    from commbench.plots.scaling import save as save_figure

    save_figure(fig, [path])


def chart_files(found, out_dir: Path, formats) -> List[Path]:
    """`commbench plot` of projection files: one chart each, named after the file."""
    from commbench.simulate.projection_file import rows_of
    from commbench.simulate.table import rate_of

    written = []
    for r in found:
        paths = [Path(out_dir) / f"{r.path.stem}.{ext}" for ext in dict.fromkeys(["png", *formats])]
        for path in paths:
            save(figure(r.doc["title"], rows_of(r.doc), rate_of(r.doc)), path)
        written += paths
    return written
