"""Does the timeline tell the truth about the network? On an emulated cluster of 2
machines x 1 rank at --link, `allreduce` (resnet18, 32 px) runs with `--timeline`, and
the DDP buckets' communication spans in the merged trace are turned into the rate at
which they moved bytes between the machines; in the same run, interleaved round by
round, `commbench microbench --op allreduce` measures the rate for each bucket's size
on the same links. Prints both, and their ratio (target: within 10%). Needs root.

    python benchmarks/diagnostics/timeline_network.py [--link 200mbit] [--rounds 3]

The figure, per rank (ring allreduce, n ranks, so busbw as nccl-tests defines it):
    sum over buckets of bytes x 2(n-1)/n  /  time the link was busy with buckets,
where the busy time is the union over a step's buckets of [when the LAST rank posted
the bucket, when it completed on this rank]. Why this and not each span's bytes over
its duration: DDP hands buckets to gloo while earlier ones are still on the wire (gloo
runs two at a time and queues the rest), so a span's duration includes its time in
the queue and its share of a link it shares with another bucket; and a span starts
when this rank posted it, which includes waiting for a peer that posted later (its
lateness, which the step split counts as waiting). Both naive figures are printed
too. The microbench reference moves the same sizes one call at a time, each at its
own measured busbw (the commbench row: DDP's default hook's divide and all_reduce):
    sum of bytes x 2(n-1)/n  /  sum of (bytes x 2(n-1)/n / busbw at that size).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

from commbench import units
from commbench.cluster import namespaces

ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
MODEL = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32",
         "--num-warmup-batches", "3", "--num-batches-per-iter", "3", "--num-iters", "4",
         "--reference-iters", "0"]
BUCKET = "allreduce bucket"  # the name optimizers/allreduce.py gives DDP's pieces


def mpirun(cluster, args: List[str], timeout: int = 1800) -> None:
    env = dict(os.environ, **ROOT_OK)
    env["PATH"] = f"{cluster.bin}{os.pathsep}{env['PATH']}"
    subprocess.run(["mpirun", "-H", cluster.hosts, "-np", str(cluster.machines), "--bind-to",
                    "none", sys.executable, "-m", "commbench", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)


def buckets(trace: dict) -> Tuple[int, Dict[Tuple[int, int], Dict[int, Tuple[float, float, int]]]]:
    """(ranks, {(step, k): {rank: (start, end, bytes)}}): the k-th bucket each rank posted
    in a step (every rank posts a step's buckets in the same order), seconds on rank 0's
    clock (the merged trace is aligned)."""
    events = trace["traceEvents"]
    ranks = len({e["pid"] for e in events if e.get("name") == "process_name"})
    spans: Dict[Tuple[int, int], List[Tuple[float, float, int]]] = {}
    for e in events:
        if e.get("cat") == "comm" and e["name"] == BUCKET:
            spans.setdefault((e["args"]["step"], e["pid"]), []).append(
                (e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, e["args"]["bytes"]))
    out: Dict[Tuple[int, int], Dict[int, Tuple[float, float, int]]] = {}
    for (step, rank), mine in spans.items():
        for k, span in enumerate(sorted(mine)):
            out.setdefault((step, k), {})[rank] = span
    complete = {key: by_rank for key, by_rank in out.items() if len(by_rank) == ranks}
    for (step, k), by_rank in complete.items():
        if len({nbytes for _, _, nbytes in by_rank.values()}) != 1:
            raise SystemExit(f"step {step}: bucket {k} differs in size between ranks")
    return ranks, complete


def union_length(intervals) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def timeline_figures(trace: dict) -> Dict[str, float]:
    """Bytes per second of the buckets (busbw), three ways: busy time counted from the
    last rank's post (the figure), from this rank's own post (as recorded), and the mean
    of each span's bytes over its duration (naive). Pooled over ranks and steps."""
    ranks, pieces = buckets(trace)
    factor = 2 * (ranks - 1) / ranks
    steps = sorted({step for step, _ in pieces})
    moved = sum(next(iter(b.values()))[2] for b in pieces.values()) * factor
    busy = recorded = 0.0
    naive = []
    for rank in range(ranks):
        for step in steps:
            mine = [b for (s, _), b in pieces.items() if s == step]
            last_post = [max(start for start, _, _ in b.values()) for b in mine]
            busy += union_length((post, b[rank][1]) for post, b in zip(last_post, mine))
            recorded += union_length(b[rank][:2] for b in mine)
            naive += [b[rank][2] * factor / (b[rank][1] - b[rank][0]) for b in mine]
    return {"ranks": ranks, "steps": len(steps), "busbw": moved * ranks / busy,
            "as_recorded": moved * ranks / recorded, "naive": statistics.mean(naive),
            "sizes": sorted({next(iter(b.values()))[2] for b in pieces.values()}),
            "per_step": sorted(next(iter(b.values()))[2] for (s, _), b in pieces.items()
                               if s == steps[0])}


def microbench(cluster, size: int, iters: int, directory: Path) -> Dict[str, float]:
    """busbw (bytes/s) of commbench's allreduce row and of the raw gloo all_reduce."""
    mpirun(cluster, ["microbench", "--op", "allreduce", "-b", str(size), "-e", str(size),
                     "-n", str(iters), "-w", "1", "-c", "0", "--results-dir", str(directory)])
    (found,) = directory.glob("*.json")
    rows = json.loads(found.read_text())["rows"]
    return {row["impl"]: row["summary"]["busbw"] for row in rows}


def reference(sizes: List[int], rates: Dict[int, float]) -> float:
    """The microbench's rate for a step's buckets sent one after another."""
    return sum(sizes) / sum(size / rates[size] for size in sizes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", default="200mbit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5, help="microbench calls per size")
    parser.add_argument("--keep", help="copy each round's trace here (a directory)")
    args = parser.parse_args()
    started = time.monotonic()
    rate = units.rate_bits(args.link, "--link") / 8
    name = f"t{os.getpid() % 10**5}"
    rows = []
    cluster = namespaces.up(name, 2, 1, args.link)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for round_ in range(args.rounds):
                trace_path = Path(scratch) / f"trace-{round_}.json"
                mpirun(cluster, ["--dist-optimizer", "allreduce", *MODEL, "--timeline",
                                 str(trace_path), "--results-dir", f"{scratch}/run{round_}"])
                trace = json.loads(trace_path.read_text())
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    (Path(args.keep) / trace_path.name).write_text(json.dumps(trace))
                found = timeline_figures(trace)
                bench = {size: microbench(cluster, size, args.iters,
                                          Path(scratch) / f"mb{round_}-{size}")
                         for size in found["sizes"]}
                ours = reference(found["per_step"], {s: b["commbench"] for s, b in bench.items()})
                gloo = reference(found["per_step"],
                                 {s: b["torch all_reduce"] for s, b in bench.items()})
                rows.append((found, bench, ours, gloo))
                print(f"round {round_}: {found['ranks']} ranks, {found['steps']} steps, "
                      f"buckets {'+'.join(f'{b / 1e6:.2f}' for b in found['per_step'])} MB; "
                      f"timeline {found['busbw'] / 1e6:.2f} MB/s (as recorded "
                      f"{found['as_recorded'] / 1e6:.2f}, naive {found['naive'] / 1e6:.2f}); "
                      f"microbench {ours / 1e6:.2f} MB/s (gloo all_reduce {gloo / 1e6:.2f}); "
                      f"per size " + ", ".join(f"{s / 1e6:.2f} MB: {b['commbench'] / 1e6:.2f}"
                                               for s, b in bench.items()), flush=True)
    finally:
        namespaces.down(name)

    def median(values):
        return statistics.median(values)

    timeline = median(f["busbw"] for f, _, _, _ in rows)
    bench = median(ours for _, _, ours, _ in rows)
    paired = median(f["busbw"] / ours for f, _, ours, _ in rows)
    print(f"\n2 machines x 1 rank at {args.link} ({rate / 1e6:.1f} MB/s), allreduce, resnet18 "
          f"32 px, {len(rows)} rounds (medians; MB/s = 1e6 bytes/s, busbw):")
    for label, value in (
            ("timeline: bucket bytes / busy link time", timeline),
            ("  as recorded (busy from own post)", median(f["as_recorded"] for f, *_ in rows)),
            ("  naive (mean of bytes / span duration)", median(f["naive"] for f, *_ in rows)),
            ("microbench, commbench allreduce", bench),
            ("microbench, torch all_reduce (gloo)", median(g for *_, g in rows))):
        print(f"  {label:<42} {value / 1e6:7.2f} MB/s  {value / rate:5.2f}x rate")
    verdict = "met" if abs(paired - 1) <= 0.10 else "NOT met"
    print(f"timeline/microbench = {timeline / bench:.3f} (ratio of medians), {paired:.3f} "
          f"(median of paired rounds); target within 10%: {verdict}")
    print(f"wall time {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
