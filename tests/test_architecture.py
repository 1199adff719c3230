"""The layering stays one-directional, and only the adapter module touches DALI."""

from __future__ import annotations

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ndd_trace")

# Each module may import only modules of a lower layer (or the same layer where listed).
LAYERS = [
    {"source", "errors", "logs", "trees"},
    {"ir"},
    {"_dali"},
    {"waits"},
    {"trace", "passes", "optimize", "guards", "interpret", "stepcheck"},
    {"lower"},
    {"runtime"},
    {"runahead"},
    {"readahead"},
    {"loop"},
    {"lazy"},
    {"per_sample"},
    {"api"},
    {"export"},
    {"__init__", "__main__", "launch"},
    {"nodes"},  # torchdata.nodes (an optional dependency): imported by no module
]


def _layer(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def _parse(path: str) -> ast.Module:
    with open(path) as file:
        return ast.parse(file.read())


def _imports(path: str) -> set[str]:
    tree = _parse(path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def _modules() -> list[str]:
    return [f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py")]


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_imports_point_down():
    for module in _modules():
        for imported in _imports(os.path.join(PACKAGE, f"{module}.py")):
            assert _layer(imported) <= _layer(module), f"{module} imports {imported}"
            if _layer(imported) == _layer(module):
                assert imported != module


def test_only_the_adapter_imports_dali():
    for module in _modules():
        if module == "_dali":
            continue
        tree = _parse(os.path.join(PACKAGE, f"{module}.py"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                else [])
            assert not any(n.startswith("nvidia") for n in names), f"{module} imports {names}"
