"""A sweep's run flags: written out in full, refused once when no strategy of the sweep
reads one, given to each job without those its strategy ignores and with a --timeline
of its own, and each job's checked as `commbench run` checks them, so that a job that
cannot run says why before any job starts.

A run flag that means nothing to a strategy (--topology to allreduce) goes only to the
jobs of the strategies that read it: `commbench run` would refuse it, and one sweep
compares strategies with and without a topology. A flag that no strategy of the sweep
reads is refused, as `commbench run` refuses it. Run flags are first written out in full
(`--topo` is `--topology`, as `commbench run` reads it), so that what the sweep looks
for in them (which strategy reads a flag, --timeline, --seed) is found however spelt.
"""

from __future__ import annotations

import argparse
from typing import List, Optional, Set

from commbench.config.flags import OneLineParser
from commbench.errors import UsageError
from commbench.timing.trace_file import beside


def checked_flags(strategies: List[str], flags: List[str]) -> List[str]:
    """The run flags, each option in full; a bad flag, or one that no strategy of the
    sweep reads, ends the sweep here in one line, before any job."""
    from commbench import registry

    flags = spelled_out(flags, _run_options())
    registry.refuse_unread(strategies, run_config(flags), "strategy of this sweep")
    return flags


def run_config_of(flags: List[str]):
    """The RunConfig of run flags however spelt; a bad flag ends the sweep in one line."""
    return run_config(spelled_out(flags, _run_options()))


def spelled_out(flags: List[str], options: Set[str]) -> List[str]:
    """flags with each abbreviation of one of options (`--topo ring`, `--topo=ring`)
    written in full, as argparse reads it; an ambiguous or unknown one is left for the
    run parser to refuse."""
    out = []
    for part in flags:
        name, equals, value = part.partition("=")
        if name.startswith("--") and name not in options:
            found = [o for o in options if o.startswith(name)]
            if len(found) == 1:
                part = found[0] + equals + value
        out.append(part)
    return out


def flags_of_job(strategy: str, flags: List[str], results_dir: str, name: str) -> List[str]:
    return [f"--dist-optimizer={strategy}", *own_timeline(flags_for(strategy, flags), name),
            "--results-dir", results_dir]


def flags_for(strategy: str, flags: List[str]) -> List[str]:
    """The run flags without those the strategy ignores; all of them for a strategy that
    cannot be loaded (its job is skipped, saying why)."""
    from commbench import registry
    from commbench.config.run_config import RunConfig
    from commbench.config.flags import flag_fields, option_name

    try:
        cls = registry.resolve(strategy)
    except UsageError:
        return list(flags)
    ignored, others = list(cls.unread(run_config_of(flags))), registry.others_options(cls)
    switches = {option_name(f.name) for f in flag_fields(RunConfig, ignored)
                if f.type in ("bool", bool)}
    switches |= {option_name(n) for n, (default, _) in others.items() if default is False}
    return without_options(flags, {option_name(n) for n in (*ignored, *others)}, switches)


def without_options(flags: List[str], options: Set[str], switches: Set[str]) -> List[str]:
    """flags without each of options (`--x V`, `--x=V`, or `--x` alone for a switch)."""
    out: List[str] = []
    skip = False
    for part in flags:
        if skip:
            skip = False
        elif part in options:
            skip = part not in switches
        elif part.split("=", 1)[0] not in options:
            out.append(part)
    return out


def own_timeline(flags: List[str], name: str) -> List[str]:
    """The run flags with a `--timeline FILE` made the job's own: FILE-<name>.json (a
    trace is never written over, so one path for every job would end all but the first)."""
    out = list(flags)
    for i, flag in enumerate(out):
        if flag == "--timeline" and i + 1 < len(out):
            out[i + 1] = beside(out[i + 1], name, "-")
        elif flag.startswith("--timeline="):
            out[i] = "--timeline=" + beside(flag.split("=", 1)[1], name, "-")
    return out


def _run_parser() -> argparse.ArgumentParser:
    from commbench.job.run import add_arguments

    parser = OneLineParser(prog="commbench run")
    add_arguments(parser)
    return parser


def _run_options() -> Set[str]:
    """Every option `commbench run` takes, plugins' own included (argparse lists them
    only in its actions)."""
    return {o for action in _run_parser()._actions for o in action.option_strings}


def run_config(job_flags: List[str]):
    """The RunConfig of a job's flags, as `commbench run` parses them; a bad flag ends
    the sweep here, in one line, before any job."""
    from commbench.config.run_config import config_from_args

    args, extra = _run_parser().parse_known_args(job_flags)
    if extra:  # said by the whole command, as `commbench run ...` would be
        OneLineParser(prog="commbench").error(f"unrecognized arguments: {' '.join(extra)}")
    return config_from_args(args)


def skip_reason(job_flags: List[str], launch) -> Optional[str]:
    """Why the job cannot run, as `commbench run` would say it; None if it can.
    The run parser rejects a bad flag here, once, instead of in every job."""
    from commbench.job.run import validate

    config = run_config(job_flags)
    try:
        validate(config, launch)
    except UsageError as e:
        return str(e)
    return None
