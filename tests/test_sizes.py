"""Small modules of one shape: no source module over 300 lines, no function over 60, and
no more than a handful of modules loose at the top of commbench/ (docs/architecture.md,
"Layout": everything else lives in a folder named for its concern), and a README whose
first screen is a front page."""

import ast

from test_layers import ROOT, modules

MODULE_LINES = 300
FUNCTION_LINES = 60
LOOSE_MODULES = 8


def test_no_module_and_no_function_is_over_its_size():
    over = []
    for name, path in sorted(modules().items()):
        source = path.read_text()
        if len(source.splitlines()) > MODULE_LINES:
            over.append(f"{name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    over.append(f"{name}.{node.name}: {lines} lines")
    assert not over, "split by concern: " + "; ".join(over)


def test_the_top_of_commbench_holds_a_handful_of_modules():
    loose = sorted(p.name for p in (ROOT / "commbench").glob("*.py"))
    assert len(loose) <= LOOSE_MODULES, loose


README_LINES = 200
SET_UP_WITHIN = 60


def test_the_readme_is_a_front_page_with_its_set_up_on_the_first_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md: {len(lines)} lines; move studies to " \
        "docs/measurements.md"
    assert "## Set up" in lines[:SET_UP_WITHIN], "README.md: '## Set up' past the first screen"
