"""The wheel installs optimizers/, launch/ and plots/ under commbench., never as
generic top-level packages (`import plots` would collide with anything)."""

import shutil
import subprocess
import sys
import zipfile

import pytest


@pytest.mark.job
@pytest.mark.timeout(600)
def test_wheel_holds_only_the_commbench_package(tmp_path):
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    # built from a copy: a build/ left in the tree would carry modules the list lacks
    source = tmp_path / "source"
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", ".whl", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        "results", "projections"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(source)], check=True, timeout=540)
    wheel = next(tmp_path.glob("commbench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"commbench", next(n for n in top if n.endswith(".dist-info"))}
    # every module of every folder, so that a package left out of pyproject's list (an
    # editable install still finds it by path) fails here
    sources = {"commbench": "commbench", "optimizers": "commbench/optimizers",
               "launch": "commbench/launch", "plots": "commbench/plots"}
    modules = {f"{into}/{path.relative_to(root / folder).as_posix()}"
               for folder, into in sources.items() for path in (root / folder).rglob("*.py")}
    assert modules - set(names) == set()
    assert "commbench/simulate/published.json" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "optimizers/", "plots/"))
                   for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[commbench.optimizers]" in text and "commbench.optimizers.allreduce:Allreduce" in text
    assert "commbench = commbench.cli:main" in text
