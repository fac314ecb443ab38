"""`commbench microbench`: communication only, swept over message sizes, with bandwidth
figures and a correctness check, nccl-tests style.

    mpiexec -n 4 python -m commbench microbench --op allreduce,neighbor_allreduce \\
        -b 8 -e 64M -f 2

This module is the command: flags, printing and the result file. For each op and
size S (bytes of float32 per rank), the contenders run interleaved within each
iteration (commbench.microbench.harness), so load on a shared machine hits all of
them alike: the commbench row, the code path the plugin runs in training, and the raw
rows, the same exchange with no commbench code (both in commbench.microbench.ops).

Every call starts from the same rank-distinct data X_r = (r + 1)·base + r², reset
outside the timed region, after a barrier; each rank times its own call. Every
commbench call's output is checked (with -c 1, the default) against the dense
reference (W_t X)_r of that call's mixing matrix (the average for allreduce); the
number of wrong results is the #wrong column. Metrics are defined in
commbench.result.metrics; the result file is of kind "microbench", its schema documented in
commbench.microbench.results (which also reads it back for `report` and `plot`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from commbench import units
from commbench.config import compression
from commbench.config.run_config import RunConfig, config_from_args
from commbench.errors import UsageError
from commbench.config.flags import (accepting, add_flags, flag_fields, int_at_least_2, names_from,
                             non_negative_int, positive_int)
from commbench.microbench import harness, link
from commbench.microbench import ops
from commbench.microbench.ops.base import ELEMENT_BYTES
from commbench.microbench.results import KIND, impl_label

# The flags microbench shares with `commbench run`, declared there.
RUN_FLAGS = ("topology", "disable_dynamic_topology", "machine_size", "cpu_transport",
             "compression", "no_cuda", "timeout", "results_dir", "tag")
STEP_FACTOR = 2  # -f when not given: sizes double


@accepting(units.SIZE_FORMS)
def size(text: str) -> int:
    """-b and -e: a size as commbench.units reads it; a bad one said as argparse says it."""
    try:
        return units.size_bytes(text)
    except UsageError:
        raise ValueError from None


def add_arguments(parser) -> None:
    known = ops.names()
    parser.add_argument("--op", type=names_from(known), default=["allreduce", "neighbor_allreduce"],
                        metavar="OPS", help=f"comma-separated ops: {', '.join(known)} "
                        "(default: allreduce,neighbor_allreduce)")
    parser.add_argument("-b", "--minbytes", type=size, default=8, metavar="SIZE",
                        help="smallest size per rank, bytes (K/M/G suffixes; default: 8)")
    parser.add_argument("-e", "--maxbytes", type=size, default=32 << 20, metavar="SIZE",
                        help="largest size per rank (default: 32M)")
    parser.add_argument("-f", "--stepfactor", type=int_at_least_2, metavar="F",
                        help=f"multiply the size by F at each step (default: {STEP_FACTOR})")
    parser.add_argument("--sizes-of", metavar="MODEL",
                        help="instead of -b/-e/-f: the sizes of MODEL's messages in training, "
                        "each of DDP's gradient buckets and its whole parameter buffer (what "
                        "local_sgd, diloco and neighbor averaging send), e.g. lm-tiny, "
                        "gpt2-small, resnet50")
    parser.add_argument("-n", "--iters", type=positive_int, default=20, metavar="N",
                        help="timed calls per contender and size (default: 20)")
    parser.add_argument("-w", "--warmup-iters", type=non_negative_int, default=5, metavar="N",
                        help="untimed calls per contender and size (default: 5)")
    parser.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                        help="check every commbench call against the dense reference "
                        "(default: 1)")
    parser.add_argument("--no-raw", action="store_true",
                        help="skip the raw primitives (no ratios)")
    add_flags(parser, flag_fields(RunConfig, RUN_FLAGS))


def sizes(begin: int, end: int, factor: int) -> List[int]:
    """Sizes in bytes from begin to end (inclusive) times factor, whole float32 elements."""
    if begin > end:
        raise UsageError(f"argument -b/--minbytes: {begin} is larger than -e/--maxbytes {end}")
    return list(dict.fromkeys(measured for _, measured in _asked(begin, end, factor)))


def _asked(begin: int, end: int, factor: int) -> List[Tuple[int, int]]:
    """(asked, measured) for each size from begin to end: a size that is not whole
    float32 elements is measured rounded down to them, one element at the least."""
    out, size = [], begin
    while size <= end:
        out.append((size, max(ELEMENT_BYTES, size // ELEMENT_BYTES * ELEMENT_BYTES)))
        size *= factor
    return out


def rounded_sizes(begin: int, end: int, factor: int, most: int = 6) -> Optional[str]:
    """The line that says which sizes asked for were measured at another size and why;
    None when every one was measured as asked."""
    changed = [f"{asked} -> {measured}" for asked, measured in _asked(begin, end, factor)
               if asked != measured]
    if not changed:
        return None
    more = f", ... ({len(changed)} in all)" if len(changed) > most else ""
    return (f"# sizes measured in whole float32 elements ({ELEMENT_BYTES} bytes each), not as "
            f"asked (bytes): {', '.join(changed[:most])}{more}")


def main(args) -> int:
    from commbench.job.startup import start
    from commbench.result import environment, store
    from commbench.result.record import written_by_rank_0

    config = config_from_args(args)  # what the plugins validate and read settings from
    # before the job: a bad --sizes-of is one line on every rank, and no rank builds alone
    of_model = model_sizes(args)
    (the_sizes, plugins), ctx, say = start(config, lambda launch: check(args, config, launch,
                                                                         of_model))
    codec = compression.of(config)
    print_header(say, args, ctx, codec)
    # Taken before the measurement: nothing that could fail between it and the write.
    machine = environment.collect(ctx) if ctx.rank == 0 else None
    found: List[Dict[str, Any]] = []
    for op in args.op:
        for nbytes in the_sizes:
            measured = harness.bench(ops.find(op), plugins[op], ctx, config,
                                     nbytes // ELEMENT_BYTES, args)
            for line in format_rows(measured):
                say(line)
            found += measured
    wrong = sum(r["wrong"] or 0 for r in found)
    for line in closing_lines(found, wrong):
        say(line)
    path = written_by_rank_0(ctx, lambda: store.write_result(
        args.results_dir, result_document(args, ctx, the_sizes, found, wrong, machine),
        f"microbench-n{ctx.world_size}"))
    say(f"# Result: {path}")
    return 1 if wrong else 0


def step_factor(args) -> int:
    """-f as given, or its default: given with one size, it is refused (check)."""
    return args.stepfactor or STEP_FACTOR


def model_sizes(args) -> List[int]:
    """--sizes-of MODEL: the distinct sizes of its DDP buckets and its whole parameter
    buffer, ascending, as `commbench simulate` lays its gradients out (a language model
    at its default --seq-len, an image model at 224 pixels: neither changes the sizes);
    [] without it."""
    if args.sizes_of is None:
        return []
    given = [flag for flag, value, default in (("-b/--minbytes", args.minbytes, 8),
                                               ("-e/--maxbytes", args.maxbytes, 32 << 20),
                                               ("-f/--stepfactor", args.stepfactor, None))
             if value != default]
    if given:
        raise UsageError(f"argument {given[0]}: --sizes-of {args.sizes_of} gives the sizes; "
                         "leave it out")
    from commbench.job import language_models
    from commbench.job.models import model_names
    from commbench.simulate import language

    name = args.sizes_of
    if language.is_language_model(name):
        language_models.check_installed(name)
    elif name not in model_names():
        raise UsageError(f"argument --sizes-of: unknown model {name!r}; `commbench list` "
                         "shows the models")
    gradients = language.gradients(name, language.default_size(name))
    return sorted({nbytes for nbytes, _ in gradients.buckets()} | {gradients.total})


def check(args, config: RunConfig, launch,
          of_model: Sequence[int] = ()) -> Tuple[List[int], Dict[str, Any]]:
    """The sizes and each op's plugin, or UsageError for a request microbench cannot
    run: on every rank alike, before any communication."""
    from commbench import registry

    codec = compression.of(config)
    if codec.kind == "powersgd":
        raise UsageError(f"argument --compression: {codec} approximates a model's gradient "
                         "matrices; microbench times flat buffers: measure it in training "
                         "(commbench run --compression ...)")
    for op in args.op:  # find() first: a plugin's op that is no Op fails before any job
        if not ops.find(op).compresses and codec.on:
            raise UsageError(f"argument --compression: means nothing to the {op} op, which "
                             "sends float32; leave it out or time that op apart")
    registry.refuse_unread(args.op, config, "op of this microbench")
    if args.stepfactor is not None and args.minbytes == args.maxbytes:
        raise UsageError(f"argument -f/--stepfactor: -b and -e give one size "
                         f"({args.minbytes} bytes), which a step factor does not change; "
                         "leave it out")
    the_sizes = list(of_model) or sizes(args.minbytes, args.maxbytes, step_factor(args))
    plugins = {op: registry.resolve(op) for op in args.op}
    for plugin in plugins.values():
        why_not = registry.usable_reason(plugin)
        if why_not:
            raise UsageError(f"argument --op: {plugin.name} cannot run here: {why_not}")
        plugin.check(config, launch)
    return the_sizes, plugins


def closing_lines(found: List[Dict[str, Any]], wrong: int) -> List[str]:
    """What the table ends with: what the link column means, where it is shown, and the
    count of wrong results, as nccl-tests ends its own."""
    lines = []
    if any(r["summary"].get("link_fraction") is not None for r in found):
        lines.append(
            f"# x rate: bytes that left each machine's interface per second (headers "
            f"included) / the emulated link's configured rate; (slow): below "
            f"{link.SLOW_FRACTION}; (burst): above {link.ABOVE_RATE}, a call short enough to "
            "pass within the rate limiter's burst, not a figure of the link")
    return lines + [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]


# --- printing and the result file -----------------------------------------------------


def print_header(say, args, ctx, codec) -> None:
    """What the job is, which sizes were measured other than asked, and the table's head."""
    say(f"# commbench microbench: {ctx.world_size} ranks ({ctx.launch.launcher}, "
        f"{ctx.num_machines} machine(s)), {ctx.backend} on {ctx.device}, float32")
    say(f"# ops: {', '.join(args.op)}; topology {args.topology} "
        f"({'static' if args.disable_dynamic_topology else 'dynamic one-peer'}); "
        f"{args.iters} timed + {args.warmup_iters} warm-up calls per contender; "
        f"check {'on' if args.check else 'off'}")
    rounded = None if args.sizes_of else rounded_sizes(args.minbytes, args.maxbytes,
                                                       step_factor(args))
    if rounded:
        say(rounded)
    if args.sizes_of:
        say(f"# sizes: {args.sizes_of}'s messages, each of DDP's gradient buckets and its "
            "whole parameter buffer (the largest)")
    if codec.on:
        say(f"# --compression {codec}: commbench's rows send {codec.wire_fraction:g} of each "
            "float32 byte. algbw/busbw/link count the float32 payload (fp32-equivalent); "
            "sent(B) and recv(B) count the bytes actually sent, as do the result's "
            "*bw_sent figures")
    say(HEADER)


IMPL_WIDTH = 32  # "MPI Neighbor_allgather + combine"
HEADER = (f"# {'op':<32} {'impl':<{IMPL_WIDTH}} {'size(B)':>11} {'time(us)':>10} "
          f"{'p50(us)':>10} {'p99(us)':>10} {'algbw':>7} {'busbw':>7} {'link':>7} "
          f"{'sent(B)':>11} {'recv(B)':>11} {'#wrong':>6} {'ours/this':>9} {'x rate':>11}\n"
          f"# {'':<32} {'':<{IMPL_WIDTH}} {'':>11} {'':>10} {'':>10} {'':>10} {'(GB/s)':>7} "
          f"{'(GB/s)':>7} {'(GB/s)':>7}")


def format_rows(rows: List[Dict[str, Any]]) -> List[str]:
    """One size's rows; each raw row carries commbench's time over its own (paired by
    call), so the ratio stands beside the primitive it is measured against."""
    ours = next((r for r in rows if r["wrong"] is not None), None)
    ratios = (ours["summary"].get("ratio_to_raw") or {}) if ours else {}
    return [format_row(row, ratios.get(row["impl"])) for row in rows]


def format_row(row: Dict[str, Any], ratio: Optional[float] = None) -> str:
    s = row["summary"]
    t = s["time"]

    def gb(key):
        return f"{s[key] / 1e9:7.3f}" if key in s else f"{'-':>7}"

    wrong = "-" if row["wrong"] is None else str(row["wrong"])
    shown = f"{ratio:.2f}" if ratio is not None else "-"
    return (f"  {row['op']:<32} {impl_label(row):<{IMPL_WIDTH}} {row['bytes']:>11} "
            f"{t['mean'] * 1e6:10.1f} {t['p50'] * 1e6:10.1f} {t['p99'] * 1e6:10.1f} "
            f"{gb('algbw')} {gb('busbw')} {gb('link_bw')} {row['bytes_sent']:11.0f} "
            f"{row['bytes_received']:11.0f} {wrong:>6} {shown:>9} "
            f"{link.flag(s.get('link_fraction')):>11}")


def result_document(args, ctx, the_sizes, rows, wrong,
                    machine: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    from commbench.result import store

    doc = store.new_document(KIND)
    doc.update(
        config={"ops": list(args.op), "minbytes": args.minbytes, "maxbytes": args.maxbytes,
                "stepfactor": step_factor(args), "iters": args.iters,
                "warmup_iters": args.warmup_iters, "check": bool(args.check),
                "raw": not args.no_raw, "dtype": "float32", "topology": args.topology,
                "disable_dynamic_topology": args.disable_dynamic_topology,
                "machine_size": args.machine_size, "no_cuda": args.no_cuda,
                "cpu_transport": args.cpu_transport, "compression": args.compression,
                "timeout": args.timeout, "tag": args.tag,
                **({"sizes_of": args.sizes_of} if args.sizes_of else {})},
        environment=machine,
        rows=rows,
        summary={"world_size": ctx.world_size, "sizes": the_sizes, "ops": list(args.op),
                 "wrong": wrong})
    return doc
