"""Does the step split put a straggler's delay where it belongs? For each strategy, speed
jobs of --workers ranks on this machine with rank 1 slowed --factor times (`--slow-ranks
1:FACTOR`) and without, in paired rounds whose order alternates (the machine drifts).
Per round and strategy, from the per-rank split the results keep:

- the slowed rank's "injected delay" per step, against the delay asked for (FACTOR - 1
  times its measured compute phases);
- the other ranks' "waiting" per step, slowed job minus plain job, against that injected
  delay, and against what they should have waited: the injected delay, plus what the
  slowed rank's own compute grew, less what theirs grew (on a shared box a rank that
  idles lends its core to the others, who then compute faster). Target: within 10% of
  the injected delay of what they should have waited;
- the other ranks' "exposed communication", slowed minus plain (target: under 10% of the
  injected delay: the delay is not the network's);
- the step gained (slowed job minus plain, mean over ranks) against what `commbench
  simulate --slow-ranks` projects for it from the slowed rank's measured compute
  (commbench.simulate.stragglers), as a check of the model on runs it never saw.

    python benchmarks/diagnostics/straggler_attribution.py [--workers 2] [--factor 2]
        [--rounds 3] [--strategies allreduce,neighbor_allreduce,local_sgd]
        [--emulate-link RATE]

With --emulate-link the jobs run on an emulated cluster of --workers machines x 1 rank
linked at RATE (root), so that the network is one and the ranks wait for each other
across it.

With more ranks than cores the ranks share cores, so a rank idling hands its core to the
others and their compute shrinks: the waiting they gain is then the delay less what they
computed faster. Run it with no more ranks than cores for the attribution itself.
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

import numpy as np

from commbench.timing.step_split import PARTS

MODEL = ["--model", "resnet18", "--image-size", "32", "--batch-size", "32",
         "--num-warmup-batches", "8", "--num-batches-per-iter", "8", "--num-iters", "4",
         "--reference-iters", "0"]
SLOW_RANK = 1


def job(args, strategy: str, slow: bool, directory: Path, cluster=None) -> dict:
    """One speed job's result: per rank, the mean of each part of its steps; and the
    slowed rank's recorded facts. On `cluster` (an emulated one) when given."""
    mpirun = str(Path(sys.executable).parent / "mpirun")
    flags = ["--dist-optimizer", strategy, *MODEL, "--results-dir", str(directory)]
    if slow:
        flags += ["--slow-ranks", f"{SLOW_RANK}:{args.factor:g}"]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    where = ["--oversubscribe"]
    if cluster is not None:
        env["PATH"] = f"{cluster.bin}{os.pathsep}{env['PATH']}"
        where = ["-H", cluster.hosts]
    subprocess.run([mpirun, "-np", str(args.workers), *where, "--bind-to", "none",
                    sys.executable, "-m", "commbench", *flags], check=True, env=env,
                   stdout=subprocess.DEVNULL, timeout=900)
    path, = directory.glob("*.json")
    doc = json.loads(path.read_text())
    path.unlink()
    rows = [dict(zip(PARTS, np.mean(rank, axis=0))) for rank in doc["samples"]["step_split"]]
    facts = (doc["summary"]["slow_ranks"] or {}).get("per_rank", {}).get(str(SLOW_RANK))
    return {"rows": rows, "facts": facts}


def attribution(plain: dict, slowed: dict) -> dict:
    """The round's figures, in seconds per step and as fractions of the injected delay."""
    injected = slowed["rows"][SLOW_RANK]["injected"]
    others = [r for r in range(len(plain["rows"])) if r != SLOW_RANK]

    def gained(part: str, ranks) -> float:
        return float(np.mean([slowed["rows"][r][part] - plain["rows"][r][part]
                              for r in ranks]))

    compute = gained("compute", others)
    return {"asked": slowed["facts"]["delay_per_slowed_step"], "injected": injected,
            "waiting": gained("waiting", others), "exposed": gained("exposed", others),
            "compute": compute,
            "due": injected + gained("compute", [SLOW_RANK]) - compute,
            "step": gained("step", range(len(plain["rows"])))}


def projected(strategy: str, workers: int, per_machine: int, factor: float,
              facts: dict) -> float:
    """What the projection's straggler model adds to the step, from the slowed rank's
    compute measured alone."""
    from commbench.simulate import costs, stragglers
    from commbench.simulate.strategy import Strategy

    compute = sum(facts[f"{p}_seconds"] for p in ("forward", "backward", "optimizer"))
    return stragglers.wait_seconds(Strategy(strategy, every=(8,)),
                                   costs.Layout(workers, per_machine),
                                   f"{SLOW_RANK}:{factor:g}", compute)


def run_rounds(args, strategies, found, cluster) -> None:
    """The paired rounds, their order alternating; each round's figures as they come."""
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for strategy in strategies:
                order = (False, True) if round_ % 2 == 0 else (True, False)
                ran = {slow: job(args, strategy, slow, Path(scratch), cluster)
                       for slow in order}
                found[strategy].append(attribution(ran[False], ran[True]))
                found[strategy][-1]["projected"] = projected(
                    strategy, args.workers, 1 if cluster else args.workers, args.factor,
                    ran[True]["facts"])
                print(f"round {round_ + 1}/{args.rounds} {strategy}: "
                      + ", ".join(f"{k} {1e3 * v:.1f} ms"
                                  for k, v in found[strategy][-1].items()), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strategies", default="allreduce,neighbor_allreduce,local_sgd")
    parser.add_argument("--emulate-link", metavar="RATE",
                        help="on an emulated cluster of --workers machines x 1 at RATE (root)")
    args = parser.parse_args()
    started = time.monotonic()
    strategies = args.strategies.split(",")
    found = {s: [] for s in strategies}
    cluster = None
    if args.emulate_link:
        from commbench.cluster import namespaces

        cluster = namespaces.up(f"a{os.getpid() % 10**5}", args.workers, 1, args.emulate_link)
    try:
        run_rounds(args, strategies, found, cluster)
    finally:
        if cluster is not None:
            namespaces.down(cluster.name)
    where = (f"{args.workers} emulated machines x 1 at {args.emulate_link}" if cluster
             else f"{args.workers} ranks on this machine")
    print(f"\n{where}, {os.cpu_count()} cores, rank {SLOW_RANK} "
          f"{args.factor:g}x slower; medians of {args.rounds} paired rounds, ms per step")
    print(f"{'strategy':<20}{'asked':>7}{'injected':>9}{'others: +compute':>17}"
          f"{'due':>7}{'+waiting':>9}{'/inj':>6}{'off due':>8}{'+exposed':>9}{'/inj':>6}"
          "  target")
    missed = 0
    for strategy in strategies:
        m = {k: statistics.median(r[k] for r in found[strategy]) for k in found[strategy][0]}
        injected = m["injected"]
        off = (m["waiting"] - m["due"]) / injected
        exposed = m["exposed"] / injected
        met = abs(off) <= 0.10 and exposed <= 0.10
        missed += not met
        print(f"{strategy:<20}{1e3 * m['asked']:>7.1f}{1e3 * injected:>9.1f}"
              f"{1e3 * m['compute']:>17.1f}{1e3 * m['due']:>7.1f}{1e3 * m['waiting']:>9.1f}"
              f"{m['waiting'] / injected:>6.2f}{off:>+8.2f}{1e3 * m['exposed']:>9.1f}"
              f"{exposed:>6.2f}  {'met' if met else 'MISSED'}")
    print("ms per step. due: what the others should have waited (injected + the slowed "
          "rank's compute gained - theirs); off due: (+waiting - due) / injected.\n"
          "target: |off due| <= 0.10 and +exposed / injected <= 0.10")
    print(f"\n{'strategy':<20}{'step gained':>12}{'projected':>11}{'error':>8}")
    for strategy in strategies:
        gained = statistics.median(r["step"] for r in found[strategy])
        model = statistics.median(r["projected"] for r in found[strategy])
        print(f"{strategy:<20}{1e3 * gained:>12.1f}{1e3 * model:>11.1f}"
              f"{model / gained - 1:>+8.0%}")
    print("the projection (commbench simulate --slow-ranks) against the step each job "
          f"gained; {time.monotonic() - started:.0f} s")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
