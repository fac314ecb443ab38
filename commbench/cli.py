"""The `commbench` command: the table of subcommands, each its own module with
`add_arguments(parser)` and `main(args)`, on plain argparse.

`commbench` (or `python -m commbench`) with run flags and no subcommand is
`commbench run`, so the Horovod/Bluefog benchmark command lines work unchanged.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

from commbench import __version__
from commbench.errors import NotRecorded, UsageError
from commbench.config.flags import OneLineParser

# subcommand -> (module, one-line help). Modules import heavy packages lazily.
SUBCOMMANDS = {
    "run": ("commbench.job.run", "run one benchmark job (the default; start it under a launcher)"),
    "list": ("commbench.listing", "list strategies, topologies and models, and which run here"),
    "sweep": ("commbench.sweep.command", "run a scaling study on this machine: jobs, report "
              "and charts"),
    "plot": ("commbench.analysis.plot_command", "draw scaling charts from result files"),
    "report": ("commbench.analysis.report", "tables of throughput, efficiency and latency"),
    "compare": ("commbench.analysis.compare", "A/B comparison of two sets of result files"),
    "microbench": ("commbench.microbench.command", "communication-only size sweeps: time, "
                   "algbw/busbw, ratio to raw primitives (start it under a launcher)"),
    "simulate": ("commbench.simulate.command", "project img/sec and efficiency to other "
                 "worker counts and links with a cost model calibrated on result files"),
    "cluster": ("commbench.cluster.command", "emulate machines with capped links on this host "
                "(network namespaces): up, down, status"),
    "supervise": ("commbench.faults.supervise", "run a job's launcher command again after it "
                  "fails, up to N times (--recovery restart under an MPI launcher)"),
    "torchft": ("commbench.faults.torchft_launch", "run a job as torchft replica groups "
                "around a lighthouse (--recovery torchft): survivors go on, a failed group "
                "heals from a peer"),
    "gossip": ("commbench.faults.gossip_launch", "run an MPI job under --recovery gossip and "
               "start a rank killed by --fail again after its +REJOIN"),
    "setup-mpirun": ("commbench.launch.mpirun_front.command", "let this environment's Open "
                     "MPI 5 mpirun take Open MPI 4's -bind-to/-map-by (horovodrun, bfrun)"),
}

# The commands whose processes are the ranks of a job; the others have no rank to name.
RANKED = ("run", "microbench")

DESCRIPTION = """\
How fast does distributed training scale under each communication strategy -
global allreduce (DDP, Horovod) or decentralized neighbor averaging (Bluefog-style)?
commbench trains one synthetic-data model under your launcher and reports img/sec,
confidence intervals and scaling efficiency.

Start here:
  commbench sweep --quick --np 1,2,4 --dist-optimizer allreduce,neighbor_allreduce
      a small scaling study on this machine, ending in a report and a chart
  mpirun -np 4 python -m commbench --dist-optimizer=neighbor_allreduce
      one job under your launcher (also torchrun, horovodrun, bfrun, srun)
  commbench list
      strategies, topologies and models, and which can run here"""


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="commbench", description=DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"commbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                parser_class=OneLineParser)
    for name, (module, help_text) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    """The command. Started as a program (argv None), it ends through end_process."""
    ending = sys.exit if argv is not None else end_process
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "run")
    try:
        parser = build_parser()
    except UsageError as e:  # an installed plugin whose flags clash: every command says so
        ending(say_error(str(e), UsageError.exit_code))
        return
    args, extra = parser.parse_known_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    if extra and not getattr(module, "PASSES_RUN_FLAGS", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.run_flags = extra
    try:
        code = module.main(args)
    except UsageError as e:
        code = say_error(str(e), UsageError.exit_code)
    except NotRecorded as e:  # said once, by the rank that could not write
        code = say_error(str(e), e.exit_code) if str(e) else e.exit_code
    except KeyboardInterrupt:
        code = say_error("interrupted", 130)
    except BrokenPipeError:  # `commbench list | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    except Exception as e:  # one line per failing rank, never a traceback wall
        from commbench.job import failure

        if args.command in RANKED:
            failure.describe_and_abort(e)
        code = say_error(failure.describe_without_rank(e), 1)
    ending(code or 0)


def say_error(message: str, code: int) -> int:
    print(f"commbench: error: {message}", file=sys.stderr, flush=True)
    return code


def end_process(code: int) -> None:
    """End the process once its job is done or refused. After torch.distributed (and
    MPI, Horovod, Bluefog) started, without interpreter teardown: their threads can
    still hold Python objects then, and releasing them while the interpreter finalizes
    aborts the process ("terminate called without an active exception") after a job
    that succeeded. So: leave each library in order, flush, and exit at once."""
    if "torch.distributed" in sys.modules:
        from commbench.launch.distributed import leave_libraries

        leave_libraries()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
