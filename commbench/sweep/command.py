"""`commbench sweep`: its flags, and the order of the work: plan the jobs, print them
(--dry-run) or run them (on emulated clusters with --emulate), then the report and the
charts of exactly the runs it made.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

from commbench import units
from commbench.job import straggler
from commbench.cluster.state import parse_link_of
from commbench.config.run_config import RunConfig
from commbench.errors import UsageError
from commbench.config.flags import (accepting, add_flags, flag_fields, positive_float, positive_int,
                             positive_ints)
from commbench.sweep.emulate import run_emulated
from commbench.sweep.execute import job_environment, run_jobs
from commbench.sweep.plan import (SHARED_MEMORY, Job, cluster_shape, plan, plan_emulated,
                                  shell_line)
from commbench.sweep.run_flags import run_config_of

# A few minutes for 1,2 workers x 3 strategies on 2 cores (`make`), each job measured long
# enough that its own interval is narrow; whether two sweeps then agree is up to how
# steady the machine is (benchmarks/diagnostics/machine_drift.py and
# benchmarks/studies/quick_sweep_stability.json).
NP = [1, 2, 4]  # worker counts of a sweep on this machine, when --np is not given
QUICK_WORKLOAD = ["--model", "squeezenet1_1", "--image-size", "32", "--batch-size", "16"]
QUICK = QUICK_WORKLOAD + ["--num-warmup-batches", "20", "--num-batches-per-iter", "5",
                          "--num-iters", "60", "--reference-iters", "4",
                          "--reference-seconds", "3"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--np", type=positive_ints, metavar="N,N,...",
                        help=f"worker counts to run (default: {','.join(map(str, NP))})")
    parser.add_argument("--dist-optimizer", default="allreduce", metavar="NAME,...",
                        help="strategies to run, comma-separated (default: allreduce)")
    parser.add_argument("--launcher", choices=("mpiexec", "torchrun"), default="mpiexec",
                        help="how each job is started (default: mpiexec)")
    parser.add_argument("--quick", action="store_true",
                        help="a small model and images, one thread per worker: "
                        + " ".join(QUICK) + " (jobs trained to accuracy: "
                        + " ".join(QUICK_WORKLOAD) + ")")
    parser.add_argument("--job-timeout", type=positive_float, default=900, metavar="SECONDS",
                        help="end a job that runs longer than this (default: 900)")
    add_flags(parser, flag_fields(RunConfig, ["results_dir"]))
    parser.add_argument("--plots-dir", default="charts", metavar="DIR",
                        help="where the charts go (default: charts)")
    parser.add_argument("--repeat", type=positive_int, default=1, metavar="K",
                        help="run every configuration K times, round-robin; runs trained "
                        "to accuracy take seed --seed + repeat - 1, the same for every "
                        "strategy of a repeat (default: 1)")
    parser.add_argument("--emulate", type=layouts, metavar="MxS,...",
                        help="run on an emulated cluster instead (needs root; see `commbench "
                             "cluster`): each layout M machines x S ranks per machine, e.g. "
                             "1x1,2x2,4x1; takes the place of --np")
    parser.add_argument("--link", type=link_rates, metavar="RATE,...",
                        help="with --emulate: each machine's link rate, one cluster per rate; "
                             f"{SHARED_MEMORY}: no cluster, the layout's ranks on this "
                             "machine's shared memory (default: 1gbit)")
    parser.add_argument("--slow-ranks", type=straggler.spec, action="append",
                        metavar="RANKS:FACTOR[@P]",
                        help="stragglers made on purpose (`commbench run --slow-ranks`); "
                             "repeat it for an axis of the sweep, `none` for no straggler "
                             "(e.g. --slow-ranks none --slow-ranks 1:2)")
    parser.add_argument("--link-of", action="append", default=[], metavar="MACHINE=RATE,...",
                        help="with --emulate: a rate of its own for a machine of every "
                             "cluster, by index from 0 (e.g. m3=100mbit: uneven links)")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="with --np: also run the worker counts above this machine's "
                             "physical cores, which measure CPU sharing and are flagged "
                             "oversubscribed (default: leave them out, saying so)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the launcher commands, run nothing")
    parser.epilog = ("Any other `commbench run` flag is passed to every job whose strategy "
                     "reads it (--topology only to those with a topology); one that no "
                     "strategy of the sweep reads is refused. What was left out or skipped "
                     "is listed once, after the jobs and before the report; a strategy or "
                     "worker count that never ran makes the exit code 1.")


# Flags this parser does not know are `commbench run` flags, for every job.
PASSES_RUN_FLAGS = True


def quick_flags(run_flags: List[str]) -> List[str]:
    """--quick's flags: the small workload alone for jobs trained to accuracy, which time
    no iterations (and refuse a speed run's flags)."""
    return QUICK_WORKLOAD if run_config_of(run_flags).trains_to_accuracy else QUICK


@accepting("layouts MxS (machines x ranks per machine), comma-separated, e.g. 2x2,4x1")
def layouts(text: str) -> List[Tuple[int, int]]:
    found = [tuple(int(n) for n in part.lower().split("x")) for part in text.split(",")]
    if not found or any(len(f) != 2 or min(f) < 1 for f in found):
        raise ValueError
    return list(dict.fromkeys(found))


@accepting(f"link rates, comma-separated, each {units.RATE_FORMS}, or {SHARED_MEMORY} "
           "(no cluster: shared memory)")
def link_rates(text: str) -> List[str]:
    found = [r.strip() for r in text.split(",") if r.strip()]
    if not found:
        raise ValueError
    try:
        rates = [r if r == SHARED_MEMORY else units.tc_rate(r) for r in found]
    except UsageError:
        raise ValueError from None
    return list(dict.fromkeys(rates))


def main(args) -> int:
    flags = (quick_flags(args.run_flags) if args.quick else []) + args.run_flags
    strategies = [s for s in args.dist_optimizer.split(",") if s]
    cluster = f"s{os.getpid() % 10**6}"  # this sweep's own: two sweeps never share one
    refuse_misplaced(args)
    stragglers = list(dict.fromkeys(args.slow_ranks or ["none"]))
    crowded = ""  # the worker counts left out, in a line (an emulated sweep leaves none)
    if args.emulate:
        # a machine the cluster will not have: refused before anything runs
        parse_link_of(args.link_of, cluster_shape(args.emulate)[0])
        jobs = plan_emulated(args.emulate, args.link or ["1gbit"], cluster, strategies, flags,
                             args.results_dir, args.repeat, stragglers)
    else:
        counts, crowded = fitting(args.np or NP, args.oversubscribe)
        jobs = plan(counts, strategies, flags, args.launcher, args.results_dir, args.repeat,
                    stragglers)
    skipped, never = [j for j in jobs if j.skip_reason], never_run(jobs)
    left_out = [crowded] if crowded else []
    if args.dry_run:
        print_commands(jobs, args, cluster)
        for line in left_out + skip_summary(skipped, never):  # comments: the lines above run
            print(f"# {line}")
        return 1 if never else 0
    Path(args.results_dir).mkdir(parents=True, exist_ok=True)
    env = job_environment(args.quick)
    # SIGTERM (a batch system's limit, `timeout`, kill) unwinds like Ctrl-C, so the
    # running job and an emulated cluster are ended with the sweep.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.emulate:
        run_emulated(jobs, args.job_timeout, env, cluster, cluster_shape(args.emulate),
                     args.link_of)
    else:
        run_jobs(jobs, args.job_timeout, env)
    failed = [j for j in jobs if not j.ok and not j.skip_reason]
    if failed:
        print(f"{len(failed)} job(s) failed: " + ", ".join(
            f"{j.strategy} on {j.workers}" for j in failed), flush=True)
    # once, before the report: the chart's path stays the sweep's last line
    for line in left_out + skip_summary(skipped, never):
        print(line, flush=True)
    made = [str(j.result) for j in jobs if j.result]
    if made:
        _commbench("report", *made)
        _commbench("plot", *made, "-o", args.plots_dir)
    return 1 if failed or never or not made else 0


def refuse_misplaced(args) -> None:
    """A flag of one kind of sweep given to the other means nothing there: refused."""
    for given, flag in ((args.link_of, "--link-of"), (args.link, "--link")):
        if given and not args.emulate:
            raise UsageError(f"argument {flag}: sets the links of emulated machines; only "
                             "with --emulate (a sweep without it runs on this machine's "
                             "shared memory)")
    if args.emulate and args.launcher != "mpiexec":
        raise UsageError(f"argument --launcher: an emulated sweep starts every job under "
                         f"Open MPI, never {args.launcher}; leave out --launcher or --emulate")
    if args.np and args.emulate:
        raise UsageError("argument --np: an emulated sweep runs as many workers as its "
                         "layouts hold (--emulate 4x1: 4); leave out --np")
    if args.oversubscribe and args.emulate:
        raise UsageError("argument --oversubscribe: only with --np; an emulated sweep runs "
                         "each layout as given")


def fitting(counts: List[int], oversubscribe: bool) -> Tuple[List[int], str]:
    """The worker counts to run on this machine, and a line naming those left out: a
    count above its physical cores measures CPU sharing, not communication (each such
    point is flagged oversubscribed), so it runs only when asked for. Every count left
    out is a usage error, in one line."""
    from commbench.result.environment import physical_cores

    cores = physical_cores()
    over = [] if oversubscribe else [n for n in counts if n > cores]
    if not over:
        return counts, ""
    said = f"{','.join(map(str, over))} worker(s): more than this machine's {cores} " \
        "physical core(s), they would measure CPU sharing (--oversubscribe runs them)"
    if len(over) == len(counts):
        raise UsageError(f"argument --np: {said}")
    return [n for n in counts if n <= cores], f"left out {said}"


def print_commands(jobs: List[Job], args, cluster: str) -> None:
    """The launcher line of every job that can run, in order, each emulated link's
    between the commands that make and remove its cluster."""
    for link in dict.fromkeys(j.link for j in jobs):
        if link == SHARED_MEMORY:
            print("# on this machine's shared memory (no cluster)")
        elif link:
            machines, slots = cluster_shape(args.emulate)
            print(f"# commbench cluster up --name {cluster} --machines {machines} "
                  f"--slots {slots} --link {link}"
                  + "".join(f" --link-of {own}" for own in args.link_of))
        for job in (j for j in jobs if j.link == link and not j.skip_reason):
            print(shell_line(job.command)
                  + (f"  # repeat {job.repeat}/{args.repeat}" if args.repeat > 1 else ""))
        if link and link != SHARED_MEMORY:
            print(f"# commbench cluster down --name {cluster}")


def never_run(jobs: List[Job]) -> List[str]:
    """The strategies and worker counts asked for that no job runs: a mistake (an unknown
    strategy, a flag it refuses, a count nothing fits), which fails the sweep. A single
    combination that cannot run while its strategy and its count run elsewhere
    (hierarchical on one machine's worth of ranks) is a hole of the grid, listed only."""
    running = [j for j in jobs if not j.skip_reason]
    strategies = [f"strategy {s}" for s in dict.fromkeys(j.strategy for j in jobs)
                  if not any(r.strategy == s for r in running)]
    counts = [f"{n} worker(s)" + (f" at {link}" if link else "")
              for n, link in dict.fromkeys((j.workers, j.link) for j in jobs)
              if not any((r.workers, r.link) == (n, link) for r in running)]
    return strategies + counts


def skip_summary(skipped: List[Job], never: List[str]) -> List[str]:
    """What was asked for and not run, one line each, and why."""
    lines = [f"never ran: {', '.join(never)}"] if never else []
    return lines + [f"skipped: {j.strategy} on {j.workers}" + (f" at {j.link}" if j.link else "")
                    + f": {j.skip_reason}" for j in skipped]


def _commbench(*args: str) -> None:
    print(f"$ commbench {args[0]} ...", flush=True)
    subprocess.run([sys.executable, "-m", "commbench", *args], check=False)
