"""How far the model missed published scaling figures, per strategy: the summary that
benchmarks/simulate_published.py writes (published.json beside this module), shown
beside GPU projections so that a user sees how much to trust each strategy's rows
before reading them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Optional, Sequence

PATH = Path(__file__).with_name("published.json")
RELATIVE = "commbench/simulate/published.json"


def write(path: Path, scored: Dict[str, dict], command: str) -> None:
    """Replace `path` at once: a reader never sees half a summary."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps({"command": command, "strategies": scored}, indent=1)
                         + "\n")
    os.replace(temporary, path)


def load(path: Path = PATH) -> Dict[str, dict]:
    return json.loads(path.read_text())["strategies"]


def note(names: Sequence[str], path: Path = PATH) -> Optional[str]:
    """The line a GPU projection prints for the strategies in `names` that publications
    checked; None where none did."""
    scored = load(path)
    parts = [f"{name} median |error| {100 * scored[name]['median']:.0f}% over "
             f"{scored[name]['points']} points, worst {100 * scored[name]['worst']:+.0f}% "
             f"({scored[name]['worst_at']})"
             for name in dict.fromkeys(names) if name in scored]
    if not parts:
        return None
    return ("against published charts (GPUs and NCCL, not your cluster; docs/simulate.md "
            "\"Validation\"; > 0: the projection was faster than published): "
            + "; ".join(parts) + ".")
