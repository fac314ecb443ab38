"""Which allreduce does Open MPI run? For each rank count, one mpirun job runs one
mpi4py `Allreduce` (sum, in place, MPI_COMM_WORLD) per message size; the table says,
for size x ranks, which coll component took the call and which algorithm ran.

    python benchmarks/diagnostics/mpi_algorithms.py [--ranks 2,4,8]
        [--sizes 1K,64K,1M,4M,16M,64M,256M] [--dtype float64]
        [--mpirun-args "-H m0:2,m1:2"] [--mca NAME VALUE ...]

The component comes from `--mca coll_base_verbose 10`: what MPI_COMM_WORLD selected,
and why han said no (printed under the table). The algorithm cannot come from
`coll_tuned_verbose`: tuned's per-call lines are OPAL_OUTPUT, compiled out of a
release build (Open MPI from PyPI prints none). So every rank runs under gdb with a
dprintf on each allreduce entry point that libmpi exports (tuned's decision functions,
coll/base's algorithms, han's, sm's, basic's): a cell is the chain of those that ran
for that size on rank 0, e.g. `tuned fixed > segmented_ring > ring` (the fixed rules
give the segmented ring segment size 0, and it falls back to the plain ring). Without
gdb only the component is known. --mca passes settings to every job, e.g.
`--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4` to see
a forced choice; --mpirun-args puts the ranks on machines (an emulated cluster's -H).
"""

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile

from commbench import units

# libmpi's exported allreduce entry points -> the name a cell shows.
ENTRY_POINTS = {
    "ompi_coll_tuned_allreduce_intra_dec_fixed": "tuned fixed",
    "ompi_coll_tuned_allreduce_intra_dec_dynamic": "tuned dynamic",
    "ompi_coll_base_allreduce_intra_basic_linear": "basic_linear",
    "ompi_coll_base_allreduce_intra_nonoverlapping": "nonoverlapping",
    "ompi_coll_base_allreduce_intra_recursivedoubling": "recursive_doubling",
    "ompi_coll_base_allreduce_intra_ring": "ring",
    "ompi_coll_base_allreduce_intra_ring_segmented": "segmented_ring",
    "ompi_coll_base_allreduce_intra_redscat_allgather": "rabenseifner",
    "mca_coll_han_allreduce_intra_dynamic": "han",
    "mca_coll_han_allreduce_intra": "han pipelined",
    "mca_coll_han_allreduce_intra_simple": "han simple",
    "mca_coll_han_allreduce_reproducible": "han reproducible",
    "mca_coll_sm_allreduce_intra": "sm",
    "mca_coll_basic_allreduce_intra": "basic",
    "mca_coll_self_allreduce_intra": "self",
}
TAG = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>: ?(.*)$")  # mpirun --output tag
HIT = re.compile(r"@@ (\S+) (-?\d+)")
SELECTED = re.compile(r"comm_select: selecting\s+(\w+), priority\s+(\d+), (Enabled|Disabled)")
HAN = re.compile(r"coll:han:\w+ \(0/MPI_COMM_WORLD\): (.*)")


def child(sizes, dtype):
    import numpy as np
    from mpi4py import MPI

    for size in sizes:
        buffer = np.ones(max(1, size // np.dtype(dtype).itemsize), dtype=dtype)
        MPI.COMM_WORLD.Barrier()
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buffer)
        del buffer


def run(ranks, args, gdb):
    """(chain of entry points per element count, verbose summary) on rank 0."""
    command = ["mpirun", "-n", str(ranks), "--oversubscribe", "--output", "tag",
               "--mca", "coll_base_verbose", "10", *args.mpirun_args.split()]
    for name, value in args.mca:
        command += ["--mca", name, value]
    script = tempfile.NamedTemporaryFile("w", suffix=".gdb")
    if gdb:
        script.write("set breakpoint pending on\nset pagination off\n")
        for function in ENTRY_POINTS:
            script.write(f'dprintf {function},"@@ {function} %d\\n",(int)$rdx\n')
        script.flush()
        command += [gdb, "-q", "-nx", "-batch", "-x", script.name, "-ex", "run", "--args"]
    command += [sys.executable, __file__, "--child", "--sizes", args.sizes,
                "--dtype", args.dtype]
    print("$", " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if out.returncode:
        sys.exit(f"mpirun -n {ranks} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    chains, world, han = collections.defaultdict(list), False, "no verdict"
    selected = {"Enabled": [], "Disabled": []}
    for line in (out.stdout + out.stderr).splitlines():
        tagged = TAG.match(line)
        if not tagged or tagged.group(1) != "0":
            continue
        text = tagged.group(2)
        if hit := HIT.search(text):
            chain = chains[int(hit.group(2))]
            if not chain or chain[-1] != ENTRY_POINTS[hit.group(1)]:
                chain.append(ENTRY_POINTS[hit.group(1)])
        elif "new communicator:" in text:
            world = "MPI_COMM_WORLD" in text
        elif world and (chosen := SELECTED.search(text)):
            selected[chosen.group(3)].append(f"{chosen.group(1)} ({chosen.group(2)})")
        elif verdict := HAN.search(text):
            han = verdict.group(1)
    return chains, (f"{ranks} ranks: MPI_COMM_WORLD enabled (priority) "
                    f"{', '.join(selected['Enabled'])}; disabled "
                    f"{', '.join(selected['Disabled']) or '-'}; han: {han}")


def label(size):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4,8")
    parser.add_argument("--sizes", default="1K,64K,1M,4M,16M,64M,256M")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--mpirun-args", default="", help="more mpirun flags, e.g. -H")
    parser.add_argument("--mca", nargs=2, action="append", default=[],
                        metavar=("NAME", "VALUE"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [units.size_bytes(s, "--sizes") for s in args.sizes.split(",")]
    if args.child:
        return child(sizes, args.dtype)
    gdb = shutil.which("gdb")
    if not gdb:
        print("no gdb: the algorithm column stays empty, only the component is known")
    itemsize = 8 if args.dtype == "float64" else 4
    ranks = [int(r) for r in args.ranks.split(",")]
    results = {n: run(n, args, gdb) for n in ranks}
    print(f"\nAllreduce, {args.dtype} sum, in place, MPI_COMM_WORLD"
          + (f", mca {args.mca}" if args.mca else "") + "\n")
    print("| size | " + " | ".join(f"{n} ranks" for n in ranks) + " |")
    print("|---" * (len(ranks) + 1) + "|")
    for size in sizes:
        cells = [" > ".join(results[n][0].get(max(1, size // itemsize), ["?"]))
                 for n in ranks]
        print(f"| {label(size)} | " + " | ".join(cells) + " |")
    print()
    for n in ranks:
        print(results[n][1])


if __name__ == "__main__":
    main()
