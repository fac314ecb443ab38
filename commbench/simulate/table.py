"""The printed projection: the answer first (the fastest strategy at each worker count,
commbench.simulate.answer), its table (one row per strategy and worker count), the
notes that say what it rests on, and the tables of projection files for
`commbench report`."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from commbench import units
from commbench.job import straggler
from commbench.analysis import tables
from commbench.simulate import powersgd
from commbench.simulate.answer import verdicts
from commbench.simulate.link_costs import Network
from commbench.simulate.project import Inputs, Row
from commbench.simulate.strategy import PERIODIC, Strategy
from commbench.simulate.projection_file import rows_of

HEADERS = ["strategy", "N", "machines", "img/sec", "band", "E(N)", "compute ms",
           "exposed ms", "coord ms", "hidden ms", "straggler ms", "with stragglers", "allreduce",
           "basis", "measured", "error"]


def _cells(row: Row) -> List[str]:
    def ms(v):
        return "-" if v is None else f"{v * 1e3:.1f}"

    error = row.error
    measured = "-" if row.measured is None else (
        f"{row.measured:.1f}" + (f" ±{row.measured_ci:.1f}" if row.measured_ci else ""))
    return [row.strategy, str(row.workers), str(row.machines), f"{row.img_sec:.1f}",
            f"{row.low:.0f}-{row.high:.0f}", f"{100 * row.efficiency:.1f}%",
            ms(row.step.compute), ms(row.step.exposed), ms(row.step.coordination),
            ms(row.step.overlapped), ms(row.wait),
            "-" if row.with_stragglers is None else f"{row.with_stragglers:.1f}",
            row.step.algorithm, row.basis, measured,
            "-" if error is None else f"{100 * error:+.1f}%"]


def render(title: str, rows: List[Row], notes: List[str], fmt: str,
           rate: str = "img/sec") -> str:
    """The projection's answer, table and notes, its throughput in `rate` (tokens/sec for a
    language model)."""
    headers = [h.replace("img/sec", rate) for h in HEADERS]
    body = tables.render(headers, [_cells(r) for r in rows], "lrrrrrrrrrrrllrr", fmt)
    return (f"{tables.heading(title, fmt)}\n\n{render_answer(rows, fmt, rate)}\n{body}\n"
            f"{tables.notes([n.replace('img/sec', rate) for n in notes], fmt)}")


def render_answer(rows: List[Row], fmt: str, rate: str = "img/sec") -> str:
    """Which strategy is fastest at each N, by how much over the next, or too close to
    call."""
    cells = [[str(v.workers), v.fastest.strategy, f"{v.fastest.img_sec:.1f}",
              "-" if v.runner_up is None else f"{v.ratio:.2f}",
              "-" if v.runner_up is None else v.runner_up.strategy, v.call()]
             for v in verdicts(rows) if v.runner_up is not None or len(rows) == 1]
    headers = ["N", "fastest (projected)", rate, "x next", "next", "call"]
    return tables.render(headers, cells, "rlrrll", fmt)


def notes_of(inputs: Inputs, strategies: Sequence[Strategy] = ()) -> List[str]:
    net, c = inputs.network, inputs.compute_at(1)
    engines = list(dict.fromkeys(s.engine() for s in strategies if s.engine().cycle))
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
        "calibration's 95% intervals (a transport profile's: the published figures' range). "
        "E(N): img/sec / (N x one worker's compute-only img/sec).",
        "coord: what an engine's background thread adds to the step, waiting for its next "
        "cycle and negotiating with every rank which tensors all have ready"
        + (f" ({'; '.join(engine.label() for engine in engines)})" if engines else "")
        + "; DDP and commbench's own strategies have none.",
        "fastest: too close to call where the two fastest strategies' bands overlap or they "
        "differ by less than 5%, the model's own error on runs it never saw.",
        "basis: measured (a run at this N and layout), within (up to the largest N "
        "measured for the strategy), extrapolated (beyond it), unvalidated (never "
        "measured: the model alone).",
        *([f"stragglers on purpose ({straggler.parse(inputs.slow_ranks).describe()}, where a "
           "worker count has those ranks): in every row's step, as a max-plus model of who "
           "waits for whom (all ranks for an allreduce and the engines, the schedule's "
           "in-neighbors for neighbor averaging, the machine and its neighbor machines for "
           "the hierarchical step, all at a meeting of a periodic strategy), over 512 steps "
           "(commbench.simulate.stragglers)."] if inputs.slow_ranks != "none" else []),
        "with stragglers: each step also waits for the slowest worker it depends on "
        "(all for allreduce, in-neighbors for neighbor averaging), drawn from the measured "
        "per-batch times; a few hundred batches of one machine cannot show a large "
        "cluster's tail.",
    ] + ([f"hierarchical_neighbor_allreduce between machines: over gloo, a pipeline of "
          f"{units.format_bytes(inputs.pipeline_bytes)}B pieces (exchanges behind the next "
          f"pieces' sums, broadcasts behind the next pieces' exchanges)."]
         if inputs.pipeline_bytes else []) + (
        ["local_sgd, diloco: the mean step, one model allreduce every H-th step (with "
         "h1,h2 also one inside each machine every h1-th), exposed after the update; "
         "communicating less often may cost more steps to reach an accuracy, which no "
         "speed projection shows (train to accuracy: docs/run.md)."]
        if any(s.name in PERIODIC for s in strategies) else []) + [
        powersgd_note(inputs, s) for s in strategies if s.powersgd]


def powersgd_note(inputs: Inputs, strategy: Strategy) -> str:
    """What a PowerSGD projection sends and what its codec costs, and where that is from."""
    rank, min_rate = strategy.powersgd
    rate = powersgd.compression_rate(inputs.gradients, rank, min_rate)
    codec = inputs.codec.get(strategy.label())
    cost = (f"its codec {1e3 * codec:.1f} ms per step, the mean of the measured runs' split"
            if codec is not None else "its codec not measured by any run given: none "
            "counted, so the projection is optimistic")
    return (f"{strategy.label()}: torch's PowerSGD hook's bytes ({rate:.1f}x fewer elements "
            f"than the gradients, three allreduces a bucket); {cost}. Its first "
            f"{strategy.whole_steps} steps send the gradients whole (start_powerSGD_iter): "
            "not in its img/sec, in its time to a target (report's projected cells).")


# (projected part, the measured part it is set against); the projection has no "other"
SPLIT_PARTS = [("compute", "compute"), ("exposed", "exposed"), ("straggler", "waiting"),
               ("hidden", "overlapped"), ("step", "step")]


def render_split(rows: List[Row], measured: Dict[Tuple[str, int], Dict[str, float]],
                 fmt: str) -> str:
    """The projected split of each step beside the measured one, where a run of the same
    strategy and N recorded it: ms per step, projected / measured (difference)."""
    cells = []
    for row in rows:
        split = measured.get((row.strategy, row.workers))
        if split is None:
            continue
        # a run measures the engine's coordination as exposed time
        projected = {"compute": row.step.compute,
                     "exposed": row.step.exposed + row.step.coordination,
                     "straggler": row.wait or 0.0, "hidden": row.step.overlapped}
        projected["step"] = projected["compute"] + projected["exposed"] + projected["straggler"]
        cells.append([row.strategy, str(row.workers)] + [
            f"{1e3 * projected[ours]:.1f} / {1e3 * split[theirs]:.1f} "
            f"({1e3 * (projected[ours] - split[theirs]):+.1f})" for ours, theirs in SPLIT_PARTS]
            + [f"{1e3 * split['other']:.1f}"])
    if not cells:
        return ""
    headers = ["strategy", "N"] + [f"{ours} ms" for ours, _ in SPLIT_PARTS] + ["other ms"]
    title = "Step split: PROJECTED / measured (projected - measured), ms per step"
    notes = ["measured: the mean over ranks and steps of the runs' own split (docs/run.md, "
             "\"Where a step's time goes\"); straggler is set against the measured waiting "
             "for peers, hidden against the measured overlapped communication; the "
             "projection has no \"other\" (data, bookkeeping), which the measured step "
             "includes."]
    body = tables.render(headers, cells, "lr" + "r" * (len(headers) - 2), fmt)
    return f"{tables.heading(title, fmt)}\n\n{body}\n{tables.notes(notes, fmt)}"


def render_files(found, fmt: str) -> str:
    """`commbench report` of projection files: their tables, labelled as projections."""
    return "\n".join(render(r.doc["title"], rows_of(r.doc), r.doc.get("notes") or [], fmt,
                            rate_of(r.doc)) for r in found)


def rate_of(doc) -> str:
    """A projection file's throughput: tokens/sec where its workload counted tokens."""
    return "tokens/sec" if (doc.get("workload") or {}).get("unit") == "tokens" else "img/sec"
