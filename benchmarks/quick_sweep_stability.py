"""Can the quick sweep (`make`'s study) rank strategies? It runs the sweep twice, back to back,
and prints, per configuration, the two totals and their ratio, and at each worker count
the ranking of the strategies in each sweep; oversubscribed worker counts are shown and
not ranked (they measure CPU sharing).

    python benchmarks/quick_sweep_stability.py [--sweeps 2] [sweep flags...]

Target (issue: numbers a user can trust): every row's totals within 10% of each other,
and the same ranking at every worker count that is not oversubscribed.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path

from commbench.analysis.reading import analyse

README_SWEEP = ["--quick", "--np", "1,2,4", "--dist-optimizer",
                "allreduce,neighbor_allreduce,hierarchical_neighbor_allreduce,none",
                "--machine-size", "2"]


def sweep(directory: Path, flags) -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "commbench", "sweep", *flags, "--results-dir",
                    str(directory / "results"), "--plots-dir", str(directory / "charts")],
                   check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def points(directory: Path):
    (group,) = analyse([directory / "results"])[0]
    return {(p.series.label(), p.workers): p for p in group.points}


def ranking(found, workers):
    here = [(p.total, label) for (label, n), p in found.items() if n == workers]
    return [label for _, label in sorted(here, reverse=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=2)
    args, flags = parser.parse_known_args()
    flags = flags or README_SWEEP
    with tempfile.TemporaryDirectory() as work:
        dirs = [Path(work) / f"sweep{i}" for i in range(args.sweeps)]
        seconds = [sweep(d, flags) for d in dirs]
        found = [points(d) for d in dirs]
    print(f"sweep: commbench sweep {' '.join(flags)}")
    print("wall time per sweep: " + ", ".join(f"{s:.0f} s" for s in seconds))
    worst = 0.0
    print(f"{'configuration':<70} {'N':>2}  " + "  ".join(f"{f'sweep {i + 1}':>9}"
                                                           for i in range(len(found)))
          + "  max/min  flags")
    for key in sorted(found[0]):
        totals = [f[key].total for f in found if key in f]
        ratio = max(totals) / min(totals)
        worst = max(worst, ratio)
        flags_here = sorted({flag for f in found if key in f for flag in f[key].flags})
        print(f"{key[0]:<70} {key[1]:>2}  " + "  ".join(f"{t:9.1f}" for t in totals)
              + f"  {ratio:7.3f}  {' '.join(flags_here) or '-'}")
    agree = True
    for n in sorted({n for _, n in found[0]}):
        crowded = any(p.oversubscribed for f in found for (_, m), p in f.items() if m == n)
        orders = [ranking(f, n) for f in found]
        same = all(a == b for a, b in combinations(orders, 2))
        if not crowded:
            agree = agree and same
        verdict = "oversubscribed: not ranked" if crowded else ("same" if same else "DIFFERENT")
        print(f"N={n}: {verdict}: " + " | ".join(" > ".join(o) for o in orders))
    print(f"largest ratio between sweeps: {worst:.3f} (target <= 1.10); "
          f"rankings at N not oversubscribed: {'agree' if agree else 'DIFFER'}")


if __name__ == "__main__":
    main()
