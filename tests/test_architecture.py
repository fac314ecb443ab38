"""docs/architecture.md names every module of the installed package with its purpose,
and no module that is gone: its "Every module" table is checked against the tree."""

import re

from test_layers import ROOT, modules

DOC = ROOT / "docs" / "architecture.md"


def documented():
    table = DOC.read_text().split("## Every module", 1)[1].split("\n## ", 1)[0]
    return {name: purpose.strip() for name, purpose in
            re.findall(r"^\| `([\w.]+)` \|(.+)\|$", table, re.M)}


def test_every_module_is_in_the_index_with_its_purpose():
    rows = documented()
    missing = sorted(set(modules()) - set(rows))
    assert not missing, f"add to docs/architecture.md's 'Every module': {missing}"
    assert all(len(purpose) > 10 for purpose in rows.values())


def test_the_index_names_no_module_that_is_gone():
    gone = sorted(set(documented()) - set(modules()))
    assert not gone, f"docs/architecture.md's 'Every module' names removed modules: {gone}"
