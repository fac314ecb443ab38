"""The import graph of the installed package points one way (docs/architecture.md,
"Layers"): from the entry point and the commands down to the foundations, never back
up, with no cycle. Imports under `if TYPE_CHECKING:` are annotations only and do not
count; imports inside functions do (they run)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Set

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> the package it installs as (pyproject's package-dir).
SOURCES = {"commbench": "commbench", "optimizers": "commbench.optimizers",
           "launch": "commbench.launch", "plots": "commbench.plots"}

# Top to bottom. A module belongs to the layer with the most specific prefix that names
# it or one of its packages (`commbench.__init__` names the package itself only).
LAYERS = [
    ("entry", ["commbench.cli", "commbench.__main__"]),
    ("commands", ["commbench.job.run", "commbench.sweep", "commbench.listing",
                  "commbench.analysis.report", "commbench.analysis.plot_command",
                  "commbench.analysis.compare", "commbench.microbench.command",
                  "commbench.simulate.command", "commbench.cluster.command",
                  "commbench.launch.mpirun_front", "commbench.faults.supervise",
                  "commbench.faults.torchft_launch", "commbench.faults.gossip_launch",
                  "commbench.faults.torchft_machines"]),
    ("charts", ["commbench.plots"]),
    ("reading and modelling", ["commbench.analysis", "commbench.simulate", "commbench.cluster",
                               "commbench.microbench", "commbench.microbench.results"]),
    ("a job", ["commbench.job", "commbench.faults", "commbench.config.run_config", "commbench.data",
               "commbench.result.record", "commbench.registry",
               "commbench.timing.gpu_kernels", "commbench.optimizers", "commbench.comm",
               "commbench.microbench.harness", "commbench.microbench.link",
               "commbench.microbench.ops"]),
    ("foundations", ["commbench.config", "commbench.launch", "commbench.launch.lost_machine",
                     "commbench.result", "commbench.timing", "commbench.topology",
                     "commbench.job.allocator", "commbench.faults.fail_schedule",
                     "commbench.job.failure",
                     "commbench.job.language_models", "commbench.job.models",
                     "commbench.job.precision",
                     "commbench.job.straggler"]),
    ("base", ["commbench.errors", "commbench.units", "commbench.__init__"]),
]


def modules() -> Dict[str, Path]:
    found = {}
    for folder, package in SOURCES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts
                     if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def layer_of(module: str) -> int:
    if module == "commbench":
        module = "commbench.__init__"
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    assert best is not None, f"{module} is in no layer: place it in LAYERS and the docs"
    return best[0]


def runtime_imports(tree: ast.AST):
    """Import nodes, leaving out the bodies of `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            yield from (n for orelse in node.orelse for n in runtime_imports_of(orelse))
            continue
        yield from runtime_imports_of(node)


def runtime_imports_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    yield from runtime_imports(node)


def import_graph() -> Dict[str, Set[str]]:
    known = modules()
    graph: Dict[str, Set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from package import module` imports the module; else the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                           for a in node.names]
            graph[name] |= {t for t in targets if t in known and t != name}
    return graph


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_points_up():
    upward = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
              for a, targets in import_graph().items() for b in targets
              if layer_of(b) < layer_of(a)]
    assert not upward, "\n".join(sorted(upward))


def test_the_import_graph_has_no_cycle():
    graph, state, cycles = import_graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_what_it_must():
    graph = import_graph()
    # a plain import, a function-level import, and an annotation-only import left out
    assert "commbench.errors" in graph["commbench.job.run_checks"]
    assert "commbench.optimizers.base" in graph["commbench.registry"]
    assert "commbench.config.run_config" not in graph["commbench.optimizers.base"]
    assert layer_of("commbench.cli") < layer_of("commbench.job.run") \
        < layer_of("commbench.plots.scaling")
    assert layer_of("commbench.launch.mpirun_front") < layer_of("commbench.launch.detect")


def test_every_package_is_installed():
    """A package left out of pyproject's `packages` is missing from a wheel, though an
    editable install (which finds it by path) still imports it."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'"([\w.]+)"',
                            re.search(r"^packages = \[(.*?)\]", text, re.S | re.M).group(1)))
    packages = {".".join([package, *path.parent.relative_to(ROOT / folder).parts])
                for folder, package in SOURCES.items()
                for path in (ROOT / folder).rglob("__init__.py")}
    assert packages - listed == set()
