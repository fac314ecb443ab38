"""docs/run.md's fault table names, for every row, the tests that prove it: each named
test exists, so the table cannot promise what no test checks."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def fault_rows():
    text = (ROOT / "docs" / "run.md").read_text()
    table = text.split("### The fault table", 1)[1].split("\n\n")[2]
    return [line for line in table.splitlines()[2:] if line.startswith("|")]


def named_tests(row: str):
    """(file, test or None) for each `file.py::test` or `file.py` of the row's last cell;
    `::test` alone continues the file before it."""
    found, current = [], None
    for ref in re.findall(r"`([^`]+)`", row.rsplit("|", 2)[-2]):
        path, _, test = ref.partition("::")
        current = path or current
        found.append((current, test or None))
    return found


def test_every_row_names_tests_that_exist():
    rows = fault_rows()
    assert len(rows) >= 15
    for row in rows:
        named = named_tests(row)
        assert named, f"a fault with no test: {row[:80]}"
        for path, test in named:
            source = (TESTS / path).read_text()
            assert test is None or re.search(rf"^def {re.escape(test)}\(", source, re.M), \
                f"{path}::{test} (docs/run.md's fault table) does not exist"
