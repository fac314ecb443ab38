"""`python -m commbench` under mpiexec, for the strategy test files: a tiny run that
must succeed and write one result, or a bad request that must fail fast and cleanly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from launchers import TINY_RUN, mpiexec


def run_commbench(n: int, strategy: str, flags: List[str], results_dir: Path,
                  timeout: float = 300) -> Dict[str, Any]:
    """A tiny run on n ranks; returns its result document."""
    done = mpiexec(n, ["-m", "commbench", f"--dist-optimizer={strategy}", *TINY_RUN,
                       "--results-dir", str(results_dir), *flags], timeout=timeout)
    assert done.returncode == 0, \
        f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    files = list(results_dir.glob("*.json"))
    assert len(files) == 1, files
    doc = json.loads(files[0].read_text())
    assert doc["strategy"]["name"] == strategy
    loss = doc["samples"]["loss"]
    assert len(loss) == n and all(len(rank) == 3 for rank in loss)  # TINY_RUN: 3 iterations
    assert doc["summary"]["final_loss"] > 0
    return doc


def consensus_of(doc: Dict[str, Any]) -> List[float]:
    """The consensus distance per iteration, which decentralized runs must record."""
    consensus = doc["samples"]["consensus_distance"]
    assert consensus is not None and len(consensus) == 3, consensus
    assert doc["summary"]["final_consensus_distance"] == consensus[-1]
    return consensus


def assert_usage_error(n: int, flags: List[str], message: str, tmp_path: Path,
                       base: List[str] = TINY_RUN) -> None:
    """A bad request ends every rank quickly with one line naming the problem (flags
    after those of base: a tiny speed run's by default)."""
    done = mpiexec(n, ["-m", "commbench", *base, "--results-dir", str(tmp_path), *flags],
                   timeout=90)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("commbench: error:")]
    assert ours and all(line == ours[0] for line in ours), ours  # the same line on every rank
