"""ruff, with the repository's configuration (pyproject.toml's [tool.ruff]), finds
nothing in the code the card lays out: commbench/, optimizers/, launch/, plots/, tests/.
ruff is a program of its own, not a Python process: this runs in the fast tier."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["commbench", "optimizers", "launch", "plots", "tests"]


def ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed: it comes with the test extra "
                    "(pip install -e '.[test]')")
    return found


def test_ruff_finds_nothing():
    done = subprocess.run([ruff(), "check", "--no-cache", "--output-format", "concise",
                           *CHECKED],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
