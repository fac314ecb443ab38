"""The wheel installs optimizers/, launch/ and plots/ under commbench., never as
generic top-level packages (`import plots` would collide with anything)."""

import subprocess
import sys
import zipfile

import pytest


@pytest.mark.timeout(600)
def test_wheel_holds_only_the_commbench_package(tmp_path):
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(root)], check=True, timeout=540)
    wheel = next(tmp_path.glob("commbench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"commbench", next(n for n in top if n.endswith(".dist-info"))}
    for module in ("commbench/optimizers/allreduce.py", "commbench/optimizers/base.py",
                   "commbench/launch/detect.py", "commbench/launch/distributed.py",
                   "commbench/plots/__init__.py", "commbench/run.py", "commbench/cli.py",
                   "commbench/comm/neighbor_exchange.py", "commbench/analysis/report.py",
                   "commbench/microbench/ops/allreduce.py"):
        assert module in names
    assert not any(n.startswith(("tests/", "benchmarks/", "optimizers/", "plots/"))
                   for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[commbench.optimizers]" in text and "commbench.optimizers.allreduce:Allreduce" in text
    assert "commbench = commbench.cli:main" in text
