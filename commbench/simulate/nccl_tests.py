"""Links calibrated on the user's own cluster from nccl-tests output (all_reduce_perf,
sendrecv_perf, alltoall_perf) as the tool prints it: '#' header lines, the '# Rank'
lines that say which host each rank ran on, the table (out-of-place and in-place time,
algbw, busbw) and the closing '# Avg bus bandwidth'. mpirun's --tag-output prefixes
and NCCL's INFO lines between the rows are skipped.

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
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from commbench.errors import UsageError
from commbench.simulate import costs
from commbench.simulate.network import Link, Network

OPS = ("all_reduce", "sendrecv", "alltoall")
# The link each op calibrates: collectives the allreduce link, point-to-point traffic
# the neighbor-exchange one.
SLOT = {"all_reduce": "allreduce", "sendrecv": "neighbor_allreduce",
        "alltoall": "neighbor_allreduce"}
_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_STARTING = re.compile(r"Collective test starting:\s*(\w+?)_perf")
_NAMED = re.compile(r"\b(all_reduce|sendrecv|alltoall|all_gather|reduce_scatter|broadcast"
                    r"|reduce|gather|scatter|hypercube|alltoallv)_perf")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([\d.eE+-]+)")
_PER_PROCESS = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")


@dataclass
class Row:
    line: int
    size: float  # bytes, as nccl-tests' size column
    seconds: float  # mean of the out-of-place and in-place times
    busbw: float  # GB/s, the mean of the printed figures


@dataclass
class File:
    path: str
    op: str
    ranks: int
    hosts: List[str]  # one per rank, in rank order; empty when the file lists none
    machines: int
    rows: List[Row] = field(default_factory=list)
    avg_busbw: Optional[float] = None

    @property
    def link_class(self) -> str:
        return "inter" if self.machines > 1 else "intra"

    def bus_factor(self) -> float:
        n = self.ranks
        return {"all_reduce": 2 * (n - 1) / n, "alltoall": (n - 1) / n, "sendrecv": 1.0}[self.op]


def parse(path: str) -> File:
    """One nccl-tests output file; a bad one is a one-line error naming file and line."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise UsageError(f"argument --nccl-tests: cannot read {path}: {e.strerror}") from None
    lines = [_TAG.sub("", line).rstrip() for line in text.splitlines()]
    op = _op(path, lines)
    ranks: Dict[int, str] = {}
    columns: Optional[List[str]] = None
    rows, avg = [], None
    for number, line in enumerate(lines, 1):
        found = _RANK.search(line)
        if found:
            rank = int(found.group(1))
            if rank in ranks:
                raise UsageError(f"{path} line {number}: rank {rank} is listed twice: each "
                                 f"process ran alone (build nccl-tests with MPI=1)")
            ranks[rank] = found.group(2)
            continue
        tokens = line.split()
        if line.startswith("#") and "busbw" in tokens and "size" in tokens:
            if columns is not None:
                raise UsageError(f"{path} line {number}: a second table; give one "
                                 f"nccl-tests run per file")
            columns = [t for t in tokens[1:]]
        elif _AVG.search(line):
            avg = float(_AVG.search(line).group(1))
        elif columns is not None and tokens and tokens[0].isdigit():
            row = _row(path, number, tokens, columns)
            if row is not None:
                rows.append(row)
    if columns is None:
        raise UsageError(f"{path}: no nccl-tests table (no '#  size  count ... busbw' "
                         f"header line)")
    if not rows:
        raise UsageError(f"{path}: no rows under the table header")
    if ranks and sorted(ranks) != list(range(len(ranks))):
        raise UsageError(f"{path}: the '# Rank' lines skip ranks ({sorted(ranks)})")
    hosts = [ranks[r] for r in sorted(ranks)]
    if hosts:
        n, machines = len(hosts), len(set(hosts))
        if n % machines or len({hosts.count(h) for h in set(hosts)}) > 1:
            raise UsageError(f"{path}: its {n} ranks are spread unevenly over {machines} hosts")
    else:  # an excerpt: the ranks of one process share a machine
        per_process = _per_process(lines)
        n = _ranks_from_bandwidths(op, rows) or per_process
        if n is None or n % per_process:
            raise UsageError(f"{path}: no '# Rank' lines, and the number of ranks cannot be "
                             f"told from it; keep the lines nccl-tests prints under "
                             f"'# Using devices'")
        machines = n // per_process
    if n < 2:
        raise UsageError(f"{path}: one rank moves nothing; give a run of 2 or more ranks")
    return File(path, op, n, hosts, machines, rows, avg)


def _per_process(lines: List[str]) -> int:
    """Ranks in one process: nThread x nGpus of the header, else -t x -g of the command."""
    for line in lines:
        found = _PER_PROCESS.search(line)
        if found:
            return int(found.group(1)) * int(found.group(2))
    flags = {"t": 1, "g": 1}
    for line in lines:
        for flag, value in re.findall(r"\s-(t|g)\s*(\d+)", line) if "_perf" in line else ():
            flags[flag] = int(value)
    return flags["t"] * flags["g"]


def _op(path: str, lines: List[str]) -> str:
    named = next((m.group(1) for line in lines for m in [_STARTING.search(line)] if m), None)
    named = named or next((m.group(1) for line in lines for m in [_NAMED.search(line)] if m),
                          None)
    named = named or next((m.group(1) for m in [_NAMED.search(Path(path).name + "_perf")]
                           if m), None)
    if named is None:
        raise UsageError(f"{path}: cannot tell which nccl-tests test printed it (no "
                         f"'# Collective test starting' line, no test name in it or its "
                         f"file name)")
    if named not in OPS:
        raise UsageError(f"{path}: {named}_perf is not read; give all_reduce_perf, "
                         f"sendrecv_perf or alltoall_perf output")
    return named


def _row(path: str, number: int, tokens: List[str], columns: List[str]) -> Optional[Row]:
    if len(tokens) != len(columns):
        raise UsageError(f"{path} line {number}: {len(tokens)} columns under a header of "
                         f"{len(columns)}")
    times = [i for i, c in enumerate(columns) if c == "time"]
    busbws = [i for i, c in enumerate(columns) if c == "busbw"]
    wrong = [i for i, c in enumerate(columns) if c in ("#wrong", "error")]
    try:
        size = float(tokens[columns.index("size")])
        seconds = [float(tokens[i]) * 1e-6 for i in times]
        busbw = [float(tokens[i]) for i in busbws]
    except ValueError:
        raise UsageError(f"{path} line {number}: a number was expected in every time, "
                         f"size and busbw column") from None
    for i in wrong:
        if columns[i] == "#wrong" and tokens[i] not in ("0", "N/A"):
            raise UsageError(f"{path} line {number}: #wrong is {tokens[i]}: the test saw "
                             f"wrong results, its timings describe no link")
    if size == 0:  # nccl-tests times an empty operation: launch cost, not the link
        return None
    if min(seconds) <= 0:
        raise UsageError(f"{path} line {number}: a time of zero")
    return Row(number, size, float(np.mean(seconds)), float(np.mean(busbw)))


def _ranks_from_bandwidths(op: str, rows: List[Row]) -> Optional[int]:
    """n from busbw / algbw, nccl-tests' factor of n, read on the row whose printed
    figures have the most digits; None for sendrecv, whose factor is 1 at every n."""
    row = max(rows, key=lambda r: r.busbw)
    factor = row.busbw / (row.size / row.seconds / 1e9)
    if op == "all_reduce" and 1.0 <= factor < 2.0:
        return max(2, int(round(2 / (2 - factor))))
    if op == "alltoall" and 0.5 <= factor < 1.0:
        return max(2, int(round(1 / (1 - factor))))
    return None


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
