"""Is a change no slower? `commbench microbench` under two git revisions of commbench's
own package (`commbench/`, checked out into a scratch work tree; the rest of the
environment is this one), or one revision under two sets of flags (`--old-flags`,
`--new-flags`), in rounds whose order alternates, so that the machine's drift hits
both alike. Prints, per op and size, the median call time of commbench's
row under each revision and the paired ratio old/new (> 1: the new one is faster)
with the 95% interval of its geometric mean over the rounds.

    python benchmarks/ab/ab.py revisions --old c14ec1a [--new HEAD] [--rounds 3]
        [--launch "mpiexec -n 4"] -- --op hierarchical_neighbor_allreduce \\
        --machine-size 2 -b 1K -e 64M
    python benchmarks/ab/ab.py revisions --old HEAD --old-flags "--cpu-transport mpi" \\
        --launch "mpirun -H cb-m0,cb-m1 -np 2 --bind-to none" -- --op allreduce -b 4K -e 64K

Everything after `--` goes to `commbench microbench`. A size is a regression when the
interval lies wholly below 0.95; it is not decided when the interval spans 0.95.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from paired import interval

ROOT = Path(__file__).resolve().parents[2]


def checkout(revision: str, where: Path) -> Path:
    """commbench/ as of `revision`, in a directory to put first on PYTHONPATH."""
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "commbench"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def times(launch, tree: Path, flags, directory: Path):
    """{(op, bytes): p50 seconds of commbench's row} of one microbench run."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    # run outside this checkout: `python -m` puts the working directory first on the path
    subprocess.run([*launch, sys.executable, "-m", "commbench", "microbench", *flags,
                    "--results-dir", str(directory)], check=True, env=env,
                   stdout=subprocess.DEVNULL, cwd=tree.parent)
    (found,) = directory.glob("*.json")
    rows = json.loads(found.read_text())["rows"]
    return {(r["op"], r["bytes"]): r["summary"]["time"]["p50"] for r in rows if r["commbench"]}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="ab.py revisions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--old-flags", default="", help="more microbench flags of the old arm")
    parser.add_argument("--new-flags", default="", help="more microbench flags of the new arm")
    parser.add_argument("--launch", default="mpiexec -n 4 --oversubscribe")
    parser.add_argument("flags", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    launch = shlex.split(args.launch)
    got = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as scratch:
        trees = {arm: checkout(getattr(args, arm), Path(scratch) / arm) for arm in got}
        for r in range(args.rounds):
            for arm in (("old", "new") if r % 2 == 0 else ("new", "old")):
                arm_flags = [*flags, *shlex.split(getattr(args, f"{arm}_flags"))]
                got[arm].append(times(launch, trees[arm], arm_flags,
                                      Path(scratch) / f"{arm}{r}"))
            print(f"round {r + 1} of {args.rounds} done", flush=True)
    print(f"old = {args.old} {args.old_flags}, new = {args.new} {args.new_flags}, "
          f"{args.rounds} rounds, "
          f"{' '.join(launch)} commbench microbench {' '.join(flags)}")
    print(f"{'op':<34} {'bytes':>10} {'old p50 s':>10} {'new p50 s':>10} "
          f"{'old/new':>8} {'95% CI':>13}")
    for key in got["new"][0]:
        ratios = [o[key] / n[key] for o, n in zip(got["old"], got["new"])]
        low, high = interval(ratios)
        verdict = "  REGRESSION" if high < 0.95 else ("  not decided" if low < 0.95 else "")
        print(f"{key[0]:<34} {key[1]:>10} {statistics.median(o[key] for o in got['old']):10.5f} "
              f"{statistics.median(n[key] for n in got['new']):10.5f} "
              f"{statistics.median(ratios):8.3f} {low:6.3f}..{high:<6.3f}{verdict}")

