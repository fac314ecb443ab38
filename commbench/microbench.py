"""`commbench microbench`: communication only, swept over message sizes, with bandwidth
figures and a correctness check, nccl-tests style.

    mpiexec -n 4 python -m commbench microbench --op allreduce,neighbor_allreduce \\
        -b 8 -e 64M -f 2

For each op and size S (bytes of float32 per rank), the contenders run interleaved
within each iteration, so load on a shared machine hits all of them alike:

  commbench rows, the code paths the plugins run in training:
    allreduce                        one flat bucket of S bytes averaged as DDP's
                                     default comm hook does (divide by n, then
                                     torch.distributed all_reduce on the job's process
                                     group). Not DDP itself: its reducer needs a model
                                     and a backward pass, and would time those too.
    neighbor_allreduce               NeighborExchange.start()/finish() on the flat
                                     buffer the plugin fuses a model into (built by the
                                     plugin's own wrap(), schedule from --topology)
    hierarchical_neighbor_allreduce  the plugin's MachineAveraging (AWC, its default)
  raw rows, the same exchange with no commbench code:
    torch all_reduce                 dist.all_reduce of the tensor (sum), nothing else
    MPI Allreduce                    mpi4py, in place (only under an MPI launcher)
    gloo send/recv                   batch_isend_irecv of S to every out-neighbor and
                                     from every in-neighbor, one message each
    MPI Neighbor_allgather           mpi4py on a distributed-graph communicator per
                                     phase of the schedule (only under an MPI launcher)
    gloo composite                   (hierarchical) all_reduce inside the machine,
                                     leaders' send/recv, broadcast inside the machine

Every call starts from the same rank-distinct data X_r = (r + 1)·base + r², reset
outside the timed region, after a barrier; each rank times its own call. Every
commbench call's output is checked (with -c 1, the default) against the dense
reference (W_t X)_r of that call's mixing matrix (the average for allreduce); the
number of wrong results is the #wrong column. Metrics are defined in
commbench.metrics; the result file is of kind "microbench" (schema below).

Result document (kind "microbench"), besides the common header of commbench.results:
    config       the flags (ops, sizes, iterations, topology settings, ...)
    environment  as for runs
    rows         one per (op, size, implementation): op, impl, commbench (bool),
                 bytes, count, seconds [rank][call], bytes_sent/bytes_received (mean
                 per rank and call), wrong (commbench rows) and summary: time
                 {mean,p50,p99}, algbw, busbw (allreduce), link_bw (neighbor ops),
                 ratio_to_raw {impl: p50 / its p50} (commbench rows)
    summary      world_size, sizes, ops, wrong (total)
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from commbench.errors import UsageError

OPS = ("allreduce", "neighbor_allreduce", "hierarchical_neighbor_allreduce")
KIND = "microbench"
ELEMENT_BYTES = 4  # float32
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}  # as nccl-tests: powers of 1024


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMGkmg]?)[Bb]?\s*", text)
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"must be a positive size such as 8, 4K, 64M or 1G, "
                                         f"got {text!r}")
    return int(match.group(1)) * UNITS[match.group(2).upper()]


def parse_ops(text: str) -> List[str]:
    ops = [o.strip() for o in text.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if not ops or unknown:
        raise argparse.ArgumentTypeError(f"must be a comma-separated list of {', '.join(OPS)}; "
                                         f"got {text!r}")
    return list(dict.fromkeys(ops))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _factor(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 2, got {text!r}")
    return value


def add_arguments(parser) -> None:
    parser.add_argument("--op", type=parse_ops, default=["allreduce", "neighbor_allreduce"],
                        metavar="OPS", help=f"comma-separated ops: {', '.join(OPS)} "
                        "(default: allreduce,neighbor_allreduce)")
    parser.add_argument("-b", "--minbytes", type=parse_size, default=8, metavar="SIZE",
                        help="smallest size per rank, bytes (K/M/G suffixes; default: 8)")
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20, metavar="SIZE",
                        help="largest size per rank (default: 32M)")
    parser.add_argument("-f", "--stepfactor", type=_factor, default=2, metavar="F",
                        help="multiply the size by F at each step (default: 2)")
    parser.add_argument("-n", "--iters", type=_positive, default=20, metavar="N",
                        help="timed calls per contender and size (default: 20)")
    parser.add_argument("-w", "--warmup-iters", type=int, default=5, metavar="N",
                        help="untimed calls per contender and size (default: 5)")
    parser.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                        help="check every commbench call against the dense reference "
                        "(default: 1)")
    parser.add_argument("--no-raw", action="store_true",
                        help="skip the raw primitives (no ratios)")
    parser.add_argument("--topology", default="exponential-2", metavar="NAME",
                        help="topology of the neighbor ops (default: exponential-2)")
    parser.add_argument("--disable-dynamic-topology", action="store_true",
                        help="static topology every call instead of the one-peer schedule")
    parser.add_argument("--machine-size", type=_positive, default=None, metavar="N",
                        help="simulated machines of N ranks (default: the launcher's)")
    parser.add_argument("--no-cuda", action="store_true", help="stay on the CPU")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="how long a collective may wait for a peer (default: 300)")
    parser.add_argument("--results-dir", default="results", metavar="DIR",
                        help="directory for the result file (default: results)")
    parser.add_argument("--tag", default="", help="free-form label stored with the result")


def sizes(begin: int, end: int, factor: int) -> List[int]:
    """Sizes in bytes from begin to end (inclusive) times factor, whole float32 elements."""
    if begin > end:
        raise UsageError(f"argument -b/--minbytes: {begin} is larger than -e/--maxbytes {end}")
    out, size = [], begin
    while size <= end:
        out.append(max(ELEMENT_BYTES, size // ELEMENT_BYTES * ELEMENT_BYTES))
        size *= factor
    return list(dict.fromkeys(out))


def _run_config(args):
    """The RunConfig the plugins validate and read their topology settings from."""
    from commbench.config import RunConfig

    return RunConfig(dist_optimizer="allreduce", topology=args.topology,
                     disable_dynamic_topology=args.disable_dynamic_topology,
                     machine_size=args.machine_size, no_cuda=args.no_cuda,
                     timeout=args.timeout, results_dir=args.results_dir, tag=args.tag)


def main(args) -> int:
    from commbench import registry, results
    from commbench.launch.environment import detect_launch

    launch = detect_launch()
    config = _run_config(args)
    the_sizes = sizes(args.minbytes, args.maxbytes, args.stepfactor)
    if args.warmup_iters < 0:
        raise UsageError("argument -w/--warmup-iters: must be at least 0")
    plugins = {op: registry.resolve(op) for op in args.op}
    for plugin in plugins.values():  # every rank fails alike, before any communication
        if plugin.name != "allreduce":
            plugin.check(config, launch)
    results.ensure_writable(args.results_dir)

    from commbench.launch.distributed import init_distributed
    from commbench.run import Printer

    ctx = init_distributed(launch, args.no_cuda, args.timeout, args.machine_size)
    say = Printer(ctx.rank == 0)
    say(f"# commbench microbench: {ctx.world_size} ranks ({ctx.launch.launcher}, "
        f"{ctx.num_machines} machine(s)), {ctx.backend} on {ctx.device}, float32")
    say(f"# ops: {', '.join(args.op)}; topology {args.topology} "
        f"({'static' if args.disable_dynamic_topology else 'dynamic one-peer'}); "
        f"{args.iters} timed + {args.warmup_iters} warm-up calls per contender; "
        f"check {'on' if args.check else 'off'}")
    say(HEADER)
    rows: List[Dict[str, Any]] = []
    for op in args.op:
        for nbytes in the_sizes:
            bench = OpBench(op, plugins[op], ctx, config, nbytes // ELEMENT_BYTES,
                            raw=not args.no_raw, check=bool(args.check))
            measured = bench.measure(args.warmup_iters, args.iters)
            for row in measured:
                say(format_row(row))
            rows += measured
            del bench
    wrong = sum(r["wrong"] or 0 for r in rows)
    say(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    if ctx.rank == 0:
        doc = result_document(args, ctx, the_sizes, rows, wrong)
        path = results.write_result(args.results_dir, doc, f"microbench-n{ctx.world_size}")
        say(f"# Result: {path}")
    return 1 if wrong else 0


def _step(mixer) -> Callable[[], None]:
    """One averaging step of a plugin's mixer, as the training step runs it."""
    def step():
        mixer.start()
        mixer.finish()
    return step


# --- one op at one size ---------------------------------------------------------------


class Contender:
    """One implementation: reset() before each call (untimed), run() timed, then
    check(call) -> True when the output is right (commbench rows only)."""

    def __init__(self, impl: str, run: Callable[[], None], reset: Callable[[], None],
                 check: Optional[Callable[[int], bool]] = None,
                 traffic: Optional[Callable[[int], Tuple[float, float]]] = None):
        self.impl, self.run, self.reset, self.check = impl, run, reset, check
        self.traffic = traffic  # call -> (bytes sent, bytes received) by this rank
        self.seconds: List[float] = []
        self.wrong = 0
        self.sent: List[float] = []
        self.received: List[float] = []


class OpBench:
    """The contenders of one op at one size on this rank, built from the plugins."""

    def __init__(self, op: str, plugin_cls, ctx, config, count: int, raw: bool, check: bool):
        import torch

        self.op, self.ctx, self.count = op, ctx, count
        self.nbytes = count * ELEMENT_BYTES
        self.n, self.rank = ctx.world_size, ctx.rank
        self.check_on = check
        # Rank-distinct data X_r = c_r base + d_r: base varies along the buffer (a chunk
        # delivered to the wrong place shows), c_r and d_r along the ranks (a message
        # from the wrong peer shows). All values are exact in float32.
        index = torch.arange(count, dtype=torch.float32, device=ctx.device)
        self.base = 1.0 + torch.remainder(index, 97.0) / 128.0
        self.c = [float(r + 1) for r in range(self.n)]
        self.d = [float(r * r) for r in range(self.n)]
        self.pristine = self.c[self.rank] * self.base + self.d[self.rank]
        self.contenders: List[Contender] = []
        getattr(self, "_build_" + op)(plugin_cls, config, raw)

    # The expected output of a call that computes sum_j w[j] X_j on this rank.
    def _is_right(self, out, weights) -> bool:
        a = sum(w * self.c[j] for j, w in enumerate(weights))
        b = sum(w * self.d[j] for j, w in enumerate(weights))
        expected = self.base * a + b
        error = float((out - expected).abs().max()) if self.count else 0.0
        return error <= 1e-5 * (1.0 + abs(a) * 1.8 + abs(b))

    def _copy_in(self, buffer):
        return lambda: buffer.copy_(self.pristine)

    # allreduce ------------------------------------------------------------------------

    def _build_allreduce(self, plugin_cls, config, raw: bool) -> None:
        import torch.distributed as dist

        from commbench import metrics

        buffer = self.pristine.clone()
        n = self.n
        ring = metrics.ring_allreduce_bytes(self.nbytes, n)

        def averaged():  # DDP's default comm hook on one bucket: divide, then sum
            buffer.div_(n)
            dist.all_reduce(buffer)

        self.contenders.append(Contender(
            "commbench", averaged, self._copy_in(buffer),
            lambda call: self._is_right(buffer, [1.0 / n] * n), lambda call: (ring, ring)))
        if not raw:
            return
        summed = self.pristine.clone()
        self.contenders.append(Contender("torch all_reduce", lambda: dist.all_reduce(summed),
                                         self._copy_in(summed), None, lambda call: (ring, ring)))
        if self.ctx.launch.mpi and self.ctx.device.type == "cpu":
            from mpi4py import MPI

            flat = self.pristine.clone()
            view = flat.numpy()  # zero copy: MPI reads and writes the tensor's memory
            comm = MPI.COMM_WORLD
            self.contenders.append(Contender(
                "MPI Allreduce", lambda: comm.Allreduce(MPI.IN_PLACE, view),
                self._copy_in(flat), None, lambda call: (ring, ring)))

    # neighbor_allreduce --------------------------------------------------------------

    def _plugin(self, plugin_cls, config):
        """The plugin, wrapped around a model whose parameters are one flat buffer of
        `count` elements, exactly as in training; returns (plugin, buffer)."""
        import torch

        model = torch.nn.Module()
        model.weight = torch.nn.Parameter(self.pristine.clone())
        plugin = plugin_cls(self.ctx, config)
        plugin.wrap(model, torch.optim.SGD(model.parameters(), lr=0.0))
        return plugin, model.weight.data

    def _build_neighbor_allreduce(self, plugin_cls, config, raw: bool) -> None:
        plugin, buffer = self._plugin(plugin_cls, config)
        exchange = plugin.mixer
        schedule = plugin.schedule
        S = self.nbytes

        def traffic(call):
            p = exchange.plan(call)
            return len(p.destinations) * S, len(p.sources) * S

        def right(call):
            return self._is_right(buffer, schedule.at(call).weights[self.rank])

        self.contenders.append(Contender("commbench", _step(exchange), self._copy_in(buffer),
                                         right, traffic))
        if raw:
            self._add_raw_neighbor(lambda call: exchange.plan(call), schedule, traffic)

    def _add_raw_neighbor(self, plan_at, schedule, traffic, ranks=None, node=None) -> None:
        """Raw gloo send/recv (and MPI Neighbor_allgather) of the same bytes along the
        same peers as NeighborExchange at each call."""
        import torch
        import torch.distributed as dist

        payload = self.pristine.clone()
        incoming: List[torch.Tensor] = []
        calls = [0]

        def gloo_raw():
            plan = plan_at(calls[0])
            calls[0] += 1
            while len(incoming) < len(plan.sources):
                incoming.append(torch.empty_like(payload))
            ops = [dist.P2POp(dist.irecv, r, s) for r, (s, _) in zip(incoming, plan.sources)]
            ops += [dist.P2POp(dist.isend, payload, d) for d in plan.destinations]
            for work in dist.batch_isend_irecv(ops) if ops else []:
                work.wait()

        self.contenders.append(Contender("gloo send/recv", gloo_raw, lambda: None, None,
                                         traffic))
        if ranks is None and self.ctx.launch.mpi and self.ctx.device.type == "cpu":
            self.contenders.append(Contender("MPI Neighbor_allgather",
                                             self._mpi_neighbor(schedule, payload),
                                             lambda: None, None, traffic))

    def _mpi_neighbor(self, schedule, payload):
        import numpy as np
        from mpi4py import MPI

        send = payload.numpy()
        graphs: Dict[int, Any] = {}
        calls = [0]
        # One graph communicator per phase of the schedule: MPI's neighborhood
        # collectives need the graph up front. Created collectively, so all now.
        for phase in range(schedule.period):
            t = schedule.at(phase)
            sources = list(t.in_neighbors(self.rank))
            destinations = list(t.out_neighbors(self.rank))
            comm = MPI.COMM_WORLD.Create_dist_graph_adjacent(sources, destinations,
                                                             reorder=False)
            graphs[phase] = (comm, np.empty((len(sources), send.size), dtype=send.dtype))

        def run():
            comm, receive = graphs[calls[0] % schedule.period]
            calls[0] += 1
            comm.Neighbor_allgather(send, receive)

        return run

    # hierarchical_neighbor_allreduce ----------------------------------------------

    def _build_hierarchical_neighbor_allreduce(self, plugin_cls, config, raw: bool) -> None:
        import numpy as np
        import torch.distributed as dist

        from commbench import metrics

        plugin, buffer = self._plugin(plugin_cls, config)
        mixer, schedule = plugin.mixer, plugin.schedule
        S, L = self.nbytes, self.ctx.machine_size
        machine, leader = self.rank // L, self.rank // L * L
        exchange = getattr(mixer, "exchange", None) if L > 1 else mixer

        def traffic(call):
            """Nominal bytes: ring allreduce inside the machine, the leader's exchange
            with neighbor machines, a flat broadcast from the leader."""
            t = schedule.at(call)
            inside = metrics.ring_allreduce_bytes(S, L) if L > 1 else 0.0
            sent, received = inside, inside
            if self.rank == leader:
                sent += len(t.out_neighbors(machine)) * S + (L - 1) * S
                received += len(t.in_neighbors(machine)) * S
            else:
                received += S
            return sent, received

        def right(call):
            w = np.repeat(schedule.at(call).weights[machine], L) / L  # (W_M kron J_L/L) row
            return self._is_right(buffer, w)

        self.contenders.append(Contender("commbench", _step(mixer), self._copy_in(buffer),
                                         right, traffic))
        if not raw:
            return
        if L == 1:  # machines of one rank: the plugin is plain neighbor averaging
            self._add_raw_neighbor(lambda call: exchange.plan(call), schedule, traffic)
            return
        import torch

        flat = self.pristine.clone()
        incoming: list = []
        calls = [0]

        def gloo_composite():
            plan = exchange.plan(calls[0]) if exchange is not None else None
            calls[0] += 1
            dist.all_reduce(flat, group=mixer.group)
            if plan is not None:
                while len(incoming) < len(plan.sources):
                    incoming.append(torch.empty_like(flat))
                ops = [dist.P2POp(dist.irecv, r, s) for r, (s, _) in zip(incoming, plan.sources)]
                ops += [dist.P2POp(dist.isend, flat, d) for d in plan.destinations]
                for work in dist.batch_isend_irecv(ops) if ops else []:
                    work.wait()
            dist.broadcast(flat, leader, group=mixer.group)

        self.contenders.append(Contender("gloo composite", gloo_composite,
                                         self._copy_in(flat), None, traffic))

    # measuring ------------------------------------------------------------------------

    def measure(self, warmup: int, iters: int) -> List[Dict[str, Any]]:
        """Interleaved calls of every contender; rows (on rank 0; [] elsewhere)."""
        import torch.distributed as dist

        for call in range(warmup + iters):
            for c in self.contenders:
                c.reset()
                dist.barrier()
                start = time.perf_counter()
                c.run()
                elapsed = time.perf_counter() - start
                if self.check_on and c.check is not None and not c.check(call):
                    c.wrong += 1
                if call >= warmup:
                    c.seconds.append(elapsed)
                    sent, received = c.traffic(call)
                    c.sent.append(sent)
                    c.received.append(received)
        mine = [(c.seconds, c.wrong, c.sent, c.received) for c in self.contenders]
        everyone: List[Any] = [None] * self.n
        dist.all_gather_object(everyone, mine)
        if self.rank != 0:
            return []
        return self._rows(everyone)

    def _rows(self, everyone) -> List[Dict[str, Any]]:
        import numpy as np

        from commbench import metrics

        rows = []
        for i, c in enumerate(self.contenders):
            seconds = [rank[i][0] for rank in everyone]
            stats = metrics.call_time_stats(seconds)
            summary: Dict[str, Any] = {"time": stats,
                                       "algbw": metrics.algbw(self.nbytes, stats["mean"])}
            if self.op == "allreduce":
                summary["busbw"] = summary["algbw"] * metrics.allreduce_bus_factor(self.n)
            else:
                summary["link_bw"] = metrics.algbw(self.nbytes, stats["mean"])
            rows.append({
                "op": self.op, "impl": c.impl, "commbench": c.impl == "commbench",
                "bytes": self.nbytes, "count": self.count, "seconds": seconds,
                "bytes_sent": float(np.mean([rank[i][2] for rank in everyone])),
                "bytes_received": float(np.mean([rank[i][3] for rank in everyone])),
                "bytes_sent_per_rank": [float(np.mean(rank[i][2])) for rank in everyone],
                "wrong": (sum(rank[i][1] for rank in everyone)
                          if c.check is not None and self.check_on else None),
                "summary": summary,
            })
        ours = rows[0]
        ours["summary"]["ratio_to_raw"] = {
            r["impl"]: ours["summary"]["time"]["p50"] / r["summary"]["time"]["p50"]
            for r in rows[1:]}
        return rows


# --- printing and the result file -----------------------------------------------------

HEADER = (f"# {'op':<32} {'impl':<23} {'size(B)':>11} {'time(us)':>10} {'p50(us)':>10} "
          f"{'p99(us)':>10} {'algbw':>7} {'busbw':>7} {'link':>7} {'sent(B)':>11} "
          f"{'recv(B)':>11} {'#wrong':>6} {'x raw':>12}\n"
          f"# {'':<32} {'':<23} {'':>11} {'':>10} {'':>10} {'':>10} {'(GB/s)':>7} "
          f"{'(GB/s)':>7} {'(GB/s)':>7}")


def format_row(row: Dict[str, Any]) -> str:
    s = row["summary"]
    t = s["time"]
    ratios = s.get("ratio_to_raw") or {}
    ratio = " ".join(f"{v:.2f}" for v in ratios.values()) or "-"

    def gb(key):
        return f"{s[key] / 1e9:7.3f}" if key in s else f"{'-':>7}"

    wrong = "-" if row["wrong"] is None else str(row["wrong"])
    return (f"  {row['op']:<32} {row['impl']:<23} {row['bytes']:>11} {t['mean'] * 1e6:10.1f} "
            f"{t['p50'] * 1e6:10.1f} {t['p99'] * 1e6:10.1f} {gb('algbw')} {gb('busbw')} "
            f"{gb('link_bw')} {row['bytes_sent']:11.0f} {row['bytes_received']:11.0f} "
            f"{wrong:>6} {ratio:>12}")


def result_document(args, ctx, the_sizes, rows, wrong) -> Dict[str, Any]:
    from commbench import environment, results

    doc = results.new_document(KIND)
    doc.update(
        config={"ops": list(args.op), "minbytes": args.minbytes, "maxbytes": args.maxbytes,
                "stepfactor": args.stepfactor, "iters": args.iters,
                "warmup_iters": args.warmup_iters, "check": bool(args.check),
                "raw": not args.no_raw, "dtype": "float32", "topology": args.topology,
                "disable_dynamic_topology": args.disable_dynamic_topology,
                "machine_size": args.machine_size, "no_cuda": args.no_cuda,
                "timeout": args.timeout, "tag": args.tag},
        environment=environment.collect(ctx),
        rows=rows,
        summary={"world_size": ctx.world_size, "sizes": the_sizes, "ops": list(args.op),
                 "wrong": wrong})
    return doc


# --- readers (report, plot): pure functions of the files, no torch -----------------


def load(paths) -> List[Any]:
    """Every usable microbench result under paths (commbench.results.Result objects);
    the warnings about other files are the run readers' to give."""
    from commbench.results import load_results

    found, _ = load_results(paths)
    usable = []
    for result in found:
        if result.kind == KIND and isinstance(result.doc.get("rows"), list):
            usable.append(result)
    return usable


def title(doc: Dict[str, Any]) -> str:
    config, env = doc["config"], doc.get("environment") or {}
    n = doc["summary"].get("world_size")
    schedule = "static" if config.get("disable_dynamic_topology") else "dynamic one-peer"
    parts = [f"microbench, {n} ranks", f"{config.get('topology')} ({schedule})"]
    if config.get("machine_size"):
        parts.append(f"{config['machine_size']} ranks/machine")
    hardware = env.get("gpu") or env.get("cpu") or "?"
    parts.append(f"{env.get('backend', '?')} on {env.get('device', '?')} ({hardware})")
    if config.get("tag"):
        parts.append(f"tag {config['tag']}")
    return ", ".join(parts)


TABLE_HEADERS = ["op", "impl", "bytes", "time us", "p50 us", "p99 us", "algbw GB/s",
                 "busbw GB/s", "link GB/s", "sent B/rank", "recv B/rank", "#wrong", "x raw"]
TABLE_FIELDS = ("op", "impl", "bytes", "time_mean_s", "time_p50_s", "time_p99_s",
                "algbw", "busbw", "link_bw", "bytes_sent", "bytes_received", "wrong",
                "ratio_to_raw")
NOTES = [
    "time: seconds per call pooled over ranks and calls (mean, p50, p99); each call "
    "after a barrier, on data reset outside the timed region.",
    "algbw = bytes / mean time; busbw = algbw x 2(n-1)/n for allreduce (nccl-tests); "
    "link = bytes / mean time for neighbor ops (links run concurrently).",
    "sent/recv: nominal bytes per rank and call (ring allreduce 2(n-1)/n x S; neighbor "
    "exchange out/in-degree x S). x raw: commbench p50 / the raw primitive's p50, one "
    "ratio per raw row in the order listed.",
]


def record(row: Dict[str, Any]) -> Dict[str, Any]:
    s = row["summary"]
    return {"op": row["op"], "impl": row["impl"], "bytes": row["bytes"],
            "time_mean_s": s["time"]["mean"], "time_p50_s": s["time"]["p50"],
            "time_p99_s": s["time"]["p99"], "algbw": s.get("algbw"), "busbw": s.get("busbw"),
            "link_bw": s.get("link_bw"), "bytes_sent": row.get("bytes_sent"),
            "bytes_received": row.get("bytes_received"), "wrong": row.get("wrong"),
            "ratio_to_raw": s.get("ratio_to_raw")}


def _cells(r: Dict[str, Any]) -> List[str]:
    def gb(v):
        return "-" if v is None else f"{v / 1e9:.3f}"

    ratios = r["ratio_to_raw"] or {}
    return [r["op"], r["impl"], str(r["bytes"]), f"{r['time_mean_s'] * 1e6:.1f}",
            f"{r['time_p50_s'] * 1e6:.1f}", f"{r['time_p99_s'] * 1e6:.1f}", gb(r["algbw"]),
            gb(r["busbw"]), gb(r["link_bw"]), f"{r['bytes_sent']:.0f}",
            f"{r['bytes_received']:.0f}", "-" if r["wrong"] is None else str(r["wrong"]),
            " ".join(f"{v:.2f}" for v in ratios.values()) or "-"]


def render(found: List[Any], fmt: str = "text") -> str:
    """Tables of microbench results (commbench report), one per result file."""
    import json
    import textwrap

    from commbench import tables

    if fmt == "json":
        return json.dumps({"microbench": [
            {"title": title(r.doc), "file": str(r.path),
             "rows": [record(row) for row in r.doc["rows"]]} for r in found]}, indent=1) + "\n"
    if fmt == "csv":
        rows = [[title(r.doc)] + [json.dumps(v) if isinstance(v, dict) else v
                                  for v in record(row).values()]
                for r in found for row in r.doc["rows"]]
        return tables.csv_text(["title", *TABLE_FIELDS], rows)
    parts = []
    for r in found:
        heading = title(r.doc)
        heading = f"## {heading}" if fmt == "markdown" else f"{heading}\n{'=' * len(heading)}"
        body = tables.render(TABLE_HEADERS, [_cells(record(row)) for row in r.doc["rows"]],
                             "llrrrrrrrrrrr", fmt)
        parts.append(f"{heading}\n\n{body}")
    if fmt == "markdown":
        notes = "".join(f"- {n}\n" for n in NOTES)
    else:
        notes = "".join(textwrap.fill(n, 88, subsequent_indent="  ") + "\n" for n in NOTES)
    return "\n".join(parts) + "\n" + notes
