"""How far the model missed published scaling figures, per strategy: the summary that
benchmarks/models/simulate_published.py writes (published.json beside this module), shown
beside GPU projections so that a user sees how much to trust each strategy's rows
before reading them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Optional, Sequence

from commbench.simulate.strategy import Strategy

PATH = Path(__file__).with_name("published.json")
RELATIVE = "commbench/simulate/published.json"


def write(path: Path, scored: Dict[str, dict], command: str) -> None:
    """Replace `path` at once: a reader never sees half a summary."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps({"command": command, "strategies": scored}, indent=1)
                         + "\n")
    os.replace(temporary, path)


def load(path: Path = PATH) -> Dict[str, dict]:
    """By strategy label, as `commbench simulate` prints it."""
    return json.loads(path.read_text())["strategies"]


def _record(label: str, scored: dict) -> str:
    return (f"{label} median |error| {100 * scored['median']:.0f}% over {scored['points']} "
            f"points, worst {100 * scored['worst']:+.0f}% ({scored['worst_at']})")


def note(strategies: Sequence[Strategy], path: Path = PATH) -> Optional[str]:
    """The line a GPU projection prints for the strategies publications checked: the
    record of the same settings, or, where the settings differ, which were checked."""
    try:
        scored = load(path)
    except (OSError, ValueError, KeyError) as error:
        return f"against published charts: not shown, {path} unreadable ({error})."
    parts = []
    for strategy in dict.fromkeys(strategies):
        label = strategy.label()
        if label in scored:
            parts.append(_record(label, scored[label]))
            continue
        checked = [_record(other, record) for other, record in scored.items()
                   if other.split(" (")[0] == strategy.name]
        if checked:
            parts.append(f"{label} not with these settings, only as " + ", and ".join(checked))
    if not parts:
        return None
    return ("against published charts (GPUs and NCCL, not your cluster; docs/simulate.md "
            "\"Validation\"; > 0: the projection was faster than published): "
            + "; ".join(parts) + ".")
