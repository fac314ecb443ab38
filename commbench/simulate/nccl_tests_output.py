"""nccl-tests output (all_reduce_perf, sendrecv_perf, alltoall_perf) as the tool prints
it, read into rows: '#' header lines, the '# Rank' lines that say which host each rank
ran on, the table (out-of-place and in-place time, algbw, busbw) and the closing '# Avg
bus bandwidth'. mpirun's --tag-output prefixes and NCCL's INFO lines between the rows
are skipped. What the rows calibrate is commbench.simulate.nccl_tests'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from commbench.errors import UsageError

OPS = ("all_reduce", "sendrecv", "alltoall")
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
