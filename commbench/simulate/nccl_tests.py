"""Links calibrated on the user's own cluster from nccl-tests output as the tool prints
it (read by commbench.simulate.nccl_tests_output).

Each row becomes a point of the cost model of commbench.simulate.costs: the messages
on the link's critical path, the bytes the link carries (nccl-tests' bus bytes:
busbw = size / time x 2(n-1)/n for allreduce, x (n-1)/n for alltoall, x 1 for
sendrecv) and the time. α and β come from least squares over all sizes, weighted by
1/time so that the small sizes (latency) count as much as the large ones (bandwidth);
the link also keeps β as measured at each size, which NCCL's protocols make differ
from the asymptote, so that the projection uses the file's own figure at every size
it measured. That β is solved from the projection's own cost of the row
(commbench.simulate.costs): for an allreduce the cheaper of ring and tree, as the
projection takes on GPUs, so that at the file's own layout and sizes the projection
gives the file's times back (reproduced) whichever of the two it picks.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from commbench.errors import UsageError
from commbench.simulate import costs
from commbench.simulate.nccl_tests_output import File, Row, parse
from commbench.simulate.link_costs import Link, Network

# The link each op calibrates: collectives the allreduce link, point-to-point traffic
# the neighbor-exchange one.
SLOT = {"all_reduce": "allreduce", "sendrecv": "neighbor_allreduce",
        "alltoall": "neighbor_allreduce"}


def point(f: File, row: Row, intra_alpha: float) -> Tuple[float, float, float, float]:
    """(messages, link bytes, seconds, message size) of a row, in costs' terms: an
    allreduce is a ring (2(n-1) steps, 2(M-1) of them between machines, whose intra
    steps cost intra_alpha each); sendrecv one message per rank; alltoall all its
    messages at once, the NIC carrying what leaves the machine."""
    n, m = f.ranks, f.machines
    g = n // m
    if f.op == "all_reduce":
        inside = (2 * (n - 1) - 2 * (m - 1)) * intra_alpha if m > 1 else 0.0
        messages = 2 * (m - 1) if m > 1 else 2 * (n - 1)
        return messages, 2 * (n - 1) / n * row.size, row.seconds - inside, row.size
    if f.op == "sendrecv":
        return 1.0, row.size, row.seconds, row.size
    link_bytes = g * (n - g) / n * row.size if m > 1 else (n - 1) / n * row.size
    return 1.0, link_bytes, row.seconds, row.size / n


def fit(files: List[File], intra_alpha: float, intra_source: Optional[str] = None) -> Link:
    """One link from the rows of files of one class and slot: α, β by least squares
    (relative), α no larger than any row's time allows, and β measured at each size.
    intra_source: where intra_alpha was fitted (None: stated or the default)."""
    points = [point(f, r, intra_alpha) for f in files for r in f.rows]
    names = ", ".join(Path(f.path).name for f in files)
    if any(s <= 0 for _, _, s, _ in points):
        where = "state a smaller --intra-latency" if intra_source is None else \
            f"it was fitted from {intra_source}: measure inside a machine down to small sizes"
        raise UsageError(f"nccl-tests {names}: a time is below the latency inside "
                         f"machines the model adds ({intra_alpha * 1e6:.3g} us a step); "
                         f"{where}")
    if len({size for *_, size in points}) < 3:
        raise UsageError(f"cannot fit a link from nccl-tests {names}: it needs at least "
                         f"3 sizes")
    x = np.array([[m, b] for m, b, _, _ in points], dtype=float)
    y = np.array([s for _, _, s, _ in points], dtype=float)
    weighted = x / y[:, None]  # relative residuals: every size counts alike
    (alpha, beta), *_ = np.linalg.lstsq(weighted, np.ones_like(y), rcond=None)
    alpha = float(min(max(alpha, 0.0), (y / x[:, 0]).min()))
    if beta <= 0:  # time does not grow with size in the least squares: the rows decide
        beta = float(((y - alpha * x[:, 0]) / x[:, 1]).max())
    residual = 1.0 - weighted @ np.array([alpha, beta])
    sigma2 = float((residual ** 2).sum()) / max(len(y) - 2, 1)
    beta_se = float(np.sqrt(max(sigma2 * np.linalg.pinv(weighted.T @ weighted)[1, 1], 0.0)))
    by_size: Dict[float, List[float]] = {}
    for f in files:
        for r in f.rows:
            size = point(f, r, intra_alpha)[3]
            by_size.setdefault(size, []).append(_beta_of_row(f, r, alpha, intra_alpha,
                                                             float(beta)))
    curve = tuple((size, float(np.mean(v))) for size, v in sorted(by_size.items()))
    return Link(alpha, float(beta), 1.96 * beta_se, f"nccl-tests {names}", curve)


def _beta_of_row(f: File, row: Row, alpha: float, intra_alpha: float,
                 beta: float) -> float:
    """β at which the projection's cost of the row is the row's time. An allreduce
    there runs the algorithm NCCL's tuning model picks (costs.nccl_algorithm, from the
    link's least-squares rate, as the projection picks it), so β is that algorithm's
    solution. Without this, at the sizes where the tree's fewer latency steps run,
    the projection would run faster than the file (by 11% on 2 x 8 H100 at small
    sizes), the ring-only fit having put those steps into β already."""
    messages, nbytes, seconds, _ = point(f, row, intra_alpha)
    ring = max(seconds - alpha * messages, 0.0) / nbytes
    if f.op != "all_reduce":
        return ring
    m = f.machines
    g = f.ranks // m
    inside = alpha if m == 1 else intra_alpha  # one machine: the link is the intra one
    link = Link(alpha, beta)
    net = Network(link if m == 1 else Link(intra_alpha, beta), link)
    if costs.nccl_algorithm(row.size, costs.Layout(f.ranks, g), net) == "ring":
        return ring
    tree_latency = 2 * ((g - 1) * inside + math.ceil(math.log2(m)) * alpha)
    return max(row.seconds - tree_latency, 0.0) / (2 * row.size)


def links(paths: List[str], intra_alpha: float) -> Tuple[Dict[Tuple[str, str], Link], List[str]]:
    """Links by (class, op) from nccl-tests files, intra first (an inter allreduce takes
    its intra steps off with the fitted intra α), and the notes that say what was read."""
    files = [parse(p) for p in paths]
    groups: Dict[Tuple[str, str], List[File]] = {}
    for f in files:
        groups.setdefault((f.link_class, SLOT[f.op]), []).append(f)
    fitted: Dict[Tuple[str, str], Link] = {}
    for key in sorted(groups, key=lambda k: k[0] == "inter"):
        # the intra link the projection will use for this op: its own, else the other
        # op's (as links.network_from picks them), else the stated latency
        other = "neighbor_allreduce" if key[1] == "allreduce" else "allreduce"
        inner = fitted.get(("intra", key[1])) or fitted.get(("intra", other))
        fitted[key] = fit(groups[key], inner.alpha if inner else intra_alpha,
                          inner.source if inner else None)
    notes = [f"nccl-tests {Path(f.path).name}: {f.op}_perf, {f.ranks} ranks on "
             f"{f.machines} " + ("machines" if f.machines > 1 else "machine")
             + ("" if f.hosts else " (no '# Rank' lines: one process per machine assumed)")
             + (f", Avg bus bandwidth {f.avg_busbw:g} GB/s" if f.avg_busbw else "")
             + "." for f in files]
    return fitted, notes


def reproduced(f: File, link: Link, intra_alpha: float,
               algorithms: Tuple[str, ...] = ("ring", "tree")) -> List[Tuple[int, float]]:
    """(line, relative error of the modelled time) of every row: how well the link
    gives the file back, costed as the projection costs it (commbench.simulate.costs)
    at the file's own layout, intra_alpha a step inside a machine."""
    out = []
    for row in f.rows:
        if f.op == "all_reduce":
            intra = link if f.machines == 1 else Link(intra_alpha, link.beta)
            layout = costs.Layout(f.ranks, f.ranks // f.machines)
            model, _ = costs.allreduce(row.size, layout, Network(intra, link), algorithms)
        else:
            messages, nbytes, _, size = point(f, row, intra_alpha)
            model = link.seconds(nbytes, messages, size)
        out.append((row.line, model / row.seconds - 1))
    return out


def without_curve(link: Link) -> Link:
    """The plain α-β link of a fit (for showing what the curve adds)."""
    return replace(link, curve=())
