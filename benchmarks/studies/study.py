"""The study runner: a study is a spec in this folder (NAME.json), data only, that this
runner turns into `commbench sweep` jobs, the same commands a user types.

    python benchmarks/studies/study.py --list
    python benchmarks/studies/study.py time_to_accuracy [--workers 4] [--repeat 3] ...
    python benchmarks/studies/study.py quick_sweep_stability [--sweeps 2] [sweep flags]

A spec's `options` become the study's flags (`NAME --help` lists them); any other flag
goes to every sweep (kind "sweeps") or replaces the spec's sweep (kind "repeated").
Two kinds:

- "sweeps": for each value of the `for_each` option (split at its `split`, "," unless
  given: a value may hold commas), the `sweeps` (a sweep with
  `if_listed` runs only when its name is in that option), each `commbench sweep` with
  the first `placement` whose `if` option is set, its flags (and its `machines` flags,
  unless the sweep says `"machines": false`: its strategies group no ranks into
  machines, and a sweep refuses a flag none of them reads) and the `common` flags;
  then the `then` commands (`commbench report`, `plot`) and, where the spec has
  `parity`, the parity table at equal steps against its `reference` strategy (final
  loss of the averaged model and bytes per worker); the study's wall time last.
- "repeated": the same `sweep` --sweeps times back to back, then per configuration the
  totals side by side and the ranking of strategies at each worker count.

In the flags "{option}" is the option's value ("{X_slug}" the for_each value X with
":" made "-"), {"path": [...]} the parts joined as a path, {"choice": OPTION} the
flags of the option's chosen value (an option with `choices`: each value's `flags`,
and under `sets` the values it gives options left at their null default), and
{"task": NAME} the flags of a workload several studies share (tasks/NAME.json)."""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS = HERE / "tasks"  # workloads several studies share, flags only


def specs():
    """{name: spec} of every study in this folder."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(HERE.glob("*.json"))}


def options(name: str, spec: dict, argv):
    """(the study's options, the flags it does not take)."""
    parser = argparse.ArgumentParser(prog=f"study.py {name}", description=spec["question"])
    for option, o in spec.get("options", {}).items():
        parser.add_argument("--" + option.replace("_", "-"), default=o.get("default"),
                            type=int if o.get("type") == "int" else None, help=o.get("help"),
                            choices=list(o["choices"]) if "choices" in o else None)
    args, extra = parser.parse_known_args(argv)
    for option, o in spec.get("options", {}).items():
        for other, value in o.get("choices", {}).get(getattr(args, option), {}).get(
                "sets", {}).items():
            if spec["options"].get(other, {"default": ""}).get("default") is not None:
                sys.exit(f"study.py {name}: --{option}'s choices set --{other}, which must be "
                         "an option whose default is null (a default would hide the choice's)")
            if getattr(args, other) is None:
                setattr(args, other, value)
    return args, extra


def flags(template, values, spec: dict) -> list:
    """A spec's flag list with every "{option}" filled in, every {"path": parts} joined,
    every {"choice": option} made the chosen value's flags and every {"task": NAME} the
    flags of tasks/NAME.json (its `defaults` for options the study does not have)."""
    made = []
    for token in template:
        if isinstance(token, dict) and "choice" in token:
            option = token["choice"]
            chosen = spec["options"][option]["choices"][values[option]]
            made += flags(chosen["flags"], values, spec)
        elif isinstance(token, dict) and "task" in token:
            task = json.loads((TASKS / f"{token['task']}.json").read_text())
            made += flags(task["flags"], {**task["defaults"], **values}, spec)
        elif isinstance(token, dict):
            made.append(str(Path(*(p.format(**values) for p in token["path"]))))
        else:
            made.append(token.format(**values))
    return made


def run_to_its_end(command) -> None:
    """subprocess.run, except on Ctrl-C: the terminal sends the sweep the same SIGINT,
    and it ends its job and removes its emulated cluster, which subprocess.run's kill
    of the child 0.25 s later would cut short; so wait for it, then stop."""
    child = subprocess.Popen(command)
    try:
        child.wait()
    except KeyboardInterrupt:
        child.wait()
        raise


def sweeps(spec: dict, args, extra) -> None:
    started = time.monotonic()
    each = spec["for_each"]
    for value in getattr(args, each["option"]).split(each.get("split", ",")):
        values = dict(vars(args), **{each["as"]: value,
                                     each["as"] + "_slug": value.replace(":", "-")})
        where = next(p for p in spec["placement"] if not p.get("if") or values[p["if"]])
        for sweep in spec["sweeps"]:
            listed = sweep.get("if_listed")
            if listed and listed["name"] not in values[listed["option"]].split(","):
                continue
            command = [sys.executable, "-m", "commbench", "sweep",
                       *flags(placed(where, sweep) + sweep["flags"] + spec["common"], values,
                             spec),
                       *extra]
            print("$", " ".join(command[1:]), flush=True)
            run_to_its_end(command)
        # every row of the value together (each sweep reports only its own jobs)
        for then in spec["then"]:
            command = flags(then, values, spec)
            print("$ commbench", " ".join(command), flush=True)
            if "--dry-run" not in extra:  # a dry run wrote no results to read
                run_to_its_end([sys.executable, "-m", "commbench", *command])
        if "parity" in spec and "--dry-run" not in extra:
            parity(Path(flags([spec["parity"]["results"]], values, spec)[0]),
                   spec["parity"]["reference"])
    print(f"\nwall time of the study: {time.monotonic() - started:.0f} s")


def parity(results: Path, reference: str) -> None:
    """Parity at equal steps as DiLoCo's paper reports it, per strategy as configured (the
    mean over its seeds): the averaged model's final validation loss, the bytes each
    worker sent, and both against the reference strategy's."""
    from commbench.analysis.reader import read

    found, skipped = read([results])
    runs = found["accuracy"]
    by_label = {}
    for run in runs:
        by_label.setdefault(run.series.label(), []).append(run)
    if reference not in by_label:
        print(f"parity: no {reference} run in {results}{'; ' if skipped else ''}"
              + "; ".join(skipped))
        return
    figures = {label: (mean([r.curve[-1]["validation_loss"] for r in mine]),
                       mean([r.doc["summary"]["bytes_sent"] for r in mine]),
                       sorted({r.curve[-1]["step"] for r in mine}), len(mine))
               for label, mine in by_label.items()}
    floor = runs[0].doc["data"].get("entropy_rate")
    loss0, bytes0 = figures[reference][:2]
    print(f"\nparity at equal steps (floor of the loss {floor:.4f} nats/token), "
          f"against {reference}:")
    width = max(len(label) for label in figures)
    print(f"{'strategy':<{width}} {'steps':>6} {'seeds':>5} {'final loss':>10} {'gap':>7} "
          f"{'MB/worker':>10} {'bytes ratio':>11}")
    for label, (loss, sent, steps, seeds) in sorted(figures.items(), key=lambda f: f[1][1],
                                                   reverse=True):
        print(f"{label:<{width}} {'/'.join(f'{s:.0f}' for s in steps):>6} {seeds:>5} "
              f"{loss:10.4f} {100 * (loss - loss0) / loss0:+6.2f}% {sent / 1e6:10.1f} "
              f"{ratio(sent, bytes0):>11}")


def ratio(sent: float, reference: float) -> str:
    """sent against the reference's bytes: "1/N" below it (as the papers quote their
    savings), a factor above."""
    return f"1/{reference / sent:.3g}" if sent < reference else f"{sent / reference:.2f}"


def mean(values) -> float:
    return sum(values) / len(values)


def placed(placement: dict, sweep: dict) -> list:
    """The flags a placement gives a sweep: its machines only to one whose strategies
    have machines."""
    return placement["flags"] + (placement.get("machines", []) if sweep.get("machines", True)
                                 else [])


def repeated(spec: dict, args, extra) -> None:
    from commbench.analysis.reader import analyse

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

    flags = extra or spec["sweep"]
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


KINDS = {"sweeps": sweeps, "repeated": repeated}


def main(argv) -> int:
    found = specs()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__.split("\n\n")[0] + "\n")
        for name, spec in found.items():
            print(f"{name}: {spec['question']}\n  $ {spec['command']}\n")
        return 0
    name = argv[0]
    if name not in found:
        sys.exit(f"study.py: no study {name!r}; one of {', '.join(found)}")
    args, extra = options(name, found[name], argv[1:])
    KINDS[found[name]["kind"]](found[name], args, extra)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
