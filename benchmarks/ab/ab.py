"""The A/B driver: one contender of the table in contenders.py, by name.

    python benchmarks/ab/ab.py --list
    mpiexec -n 2 python benchmarks/ab/ab.py allreduce [--rounds 3] [run flags]
    python benchmarks/ab/ab.py emulation [--together]     # launches its own jobs

Every flag after the name is the contender's (`ab.py NAME --help` lists them)."""

import importlib
import sys

from contenders import CONTENDERS


def main(argv) -> None:
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__.split("\n\n")[0] + "\n")
        for c in CONTENDERS.values():
            print(f"{c.name:<10} {c.question}\n{'':<10} target: {c.target}\n"
                  f"{'':<10} $ {c.command}")
        return
    name, rest = argv[0], argv[1:]
    if name not in CONTENDERS:
        sys.exit(f"ab.py: no contender {name!r}; one of {', '.join(CONTENDERS)}")
    contender = CONTENDERS[name]
    if contender.arms:
        import arms
        from in_job import compare

        compare(contender, getattr(arms, contender.arms), rest)
    else:
        module, function = contender.runner.split(":")
        getattr(importlib.import_module(module), function)(rest)


if __name__ == "__main__":
    main(sys.argv[1:])
