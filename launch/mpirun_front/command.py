"""`commbench setup-mpirun [--remove] [--bin-dir DIR]`: put the front in place of
Open MPI 5's mpirun and mpiexec and the lost-machine keepalive in PRRTE's parameter
file, or take both out; one line per thing done."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from commbench.launch.mpirun_front.install import install, remove
from commbench.launch.mpirun_front.keepalive import set_keepalive


def add_arguments(parser) -> None:
    parser.add_argument("--remove", action="store_true",
                        help="remove the front and put the real mpirun/mpiexec back, "
                             "and PRRTE's own keepalive")
    parser.add_argument("--bin-dir", type=Path, default=Path(sysconfig.get_path("scripts")),
                        help="the directory holding mpirun (default: this environment's, "
                             "%(default)s)")


def main(args) -> int:
    said = (remove if args.remove else install)(args.bin_dir)
    for line in said + set_keepalive(args.bin_dir, remove_it=args.remove):
        print(line)
    return 0
