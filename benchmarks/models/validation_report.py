"""What simulate_validation.py's analyse prints and draws from its table (one dict per
strategy, layout and network, as in OUT/validation.json)."""

import statistics
from pathlib import Path


def print_table(table) -> None:
    """Per row, the measured mean and its 95% interval, the projection and the errors of
    the model, with its straggler term, with full overlap and of the two baselines."""
    print(f"{'network':<14}{'layout':<7}{'strategy':<33}{'measured':>16}{'projected':>10}"
          f"{'error':>8}{'w/ strag':>9}{'overlap 1':>10}{'linear':>8}{'naive':>8}")
    for r in table:
        note = " (calibration point)" if r["calibration_point"] else \
            " (held-out rate)" if r["held_out"] else ""
        ci = f"±{r['ci95']:.1f}" if r["ci95"] is not None else ""
        strag = ("-" if r["error_with_stragglers"] is None
                 else f"{100 * r['error_with_stragglers']:+.0f}%")
        print(f"{r['network']:<14}{r['layout']:<7}{r['strategy']:<33}"
              f"{r['measured']:>9.1f}{ci:>7}{r['projected']:>10.1f}{100 * r['error']:>+7.0f}%"
              f"{strag:>9}{100 * r['full_overlap_error']:>+9.0f}%"
              f"{100 * r['linear_error']:>+7.0f}%{100 * r['naive_error']:>+7.0f}%{note}")


def print_errors(table) -> None:
    """Per strategy, the median and worst |error| over the points not calibrated on,
    beside the baselines' medians."""
    scored = [r for r in table if not r["calibration_point"]]
    for strategy_name in sorted({r["strategy"] for r in scored}):
        mine = [r for r in scored if r["strategy"] == strategy_name]
        errors = [abs(r["error"]) for r in mine]
        linear = [abs(r["linear_error"]) for r in mine]
        naive = [abs(r["naive_error"]) for r in mine]
        slowed = [abs(r["error_with_stragglers"]) for r in mine]
        print(f"{strategy_name:<33} |error| median {100 * statistics.median(errors):4.1f}% "
              f"worst {100 * max(errors):4.1f}%; with stragglers median "
              f"{100 * statistics.median(slowed):4.1f}% worst {100 * max(slowed):4.1f}%; "
              f"linear median {100 * statistics.median(linear):5.1f}%, naive median "
              f"{100 * statistics.median(naive):4.1f}% ({len(errors)} points)")


def print_fits(overlaps, calibrated) -> None:
    """The overlap efficiencies and the links the projections were made with."""
    for kind, (overlap, overlap_slowed) in overlaps.items():
        print(f"overlap efficiency fitted at the {kind} calibration point: " + ", ".join(
            f"{k} {v:.2f} ({overlap_slowed[k]:.2f} with the straggler term)"
            for k, v in overlap.items()) + "; others their mean")
    print(f"links fitted: inter {calibrated.inter.describe()}; exchange inter "
          f"{calibrated.exchange_inter.describe()}; intra {calibrated.intra.describe()}")


def draw(table, path: Path, calibration_rate: str, held_out_rate: str,
         workload: str = "resnet18 32 px", rate: str = "img/sec") -> None:
    """Projected against measured throughput (`rate`), without and with the straggler term: one
    marker per strategy, hollow at the calibration point, a colour per network; the
    measurement's 95% interval as bars."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.5, 5.4), layout="constrained")
    markers = {"allreduce": "o", "neighbor_allreduce": "s",
               "hierarchical_neighbor_allreduce": "D"}
    colors = {"shared-memory": "C2", calibration_rate: "C0", held_out_rate: "C3"}
    top = 1.15 * max(max(r["measured"], r["projected"], r["with_stragglers"] or 0)
                     for r in table)
    for ax, key, title in zip(fig.subplots(1, 2), ("projected", "with_stragglers"),
                              ("the model", "the model with its straggler term")):
        for r in table:
            if r[key] is None:
                continue
            ax.errorbar(r["measured"], r[key], xerr=min(r["ci95"] or 0, r["measured"]),
                        fmt=markers[r["strategy"]], color=colors[r["network"]],
                        mfc="none" if r["calibration_point"] else colors[r["network"]],
                        capsize=2, elinewidth=0.7)
            ax.annotate(r["layout"], (r["measured"], r[key]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
        ax.plot([0, top], [0, top], color="0.5", linewidth=0.8)
        for bound in (0.8, 1.2):
            ax.plot([0, top], [0, bound * top], ":", color="0.7", linewidth=0.8)
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel(f"measured total {rate} (bars: 95% CI over repeats)")
        ax.set_ylabel(f"projected total {rate}")
        ax.set_title(title, fontsize=9)
    for name, marker in markers.items():
        ax.plot([], [], marker, color="0.3", label=name)
    for network, color in colors.items():
        ax.plot([], [], "s", color=color, label=network)
    ax.plot([], [], "o", mfc="none", color="0.3", label="calibration point")
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("commbench simulate against emulated-cluster and shared-memory runs "
                 f"({workload}, CPU workers on 2 host cores; dotted: ±20%)", fontsize=9)
    fig.savefig(path, dpi=110)
    print(f"chart: {path}")
