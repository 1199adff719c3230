"""The layering stays one-directional, the folders show it, and only the adapter touches DALI."""

from __future__ import annotations

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ndd_trace")

# The folders, lowest first: a module imports only from its own folder or folders below it.
FOLDERS = ["core", "_dali", "tracing", "codegen", "execution", "ahead", "modes", ""]

# Modules (dotted, within the package), lowest first: each imports only modules of a lower layer
# (or of its own layer, where several are listed together).
LAYERS = [
    {"core.source", "core.errors", "core.logs", "core.trees", "core.files"},
    {"core.ir"},
    {"core.passes"},
    {"_dali.base"},
    {"_dali.analysis"},
    {"_dali.operators"},
    {"_dali.interception"},
    {"_dali.data"},
    {"_dali.random"},
    {"_dali.readers"},
    {"_dali.pipelines"},
    {"_dali.conditionals"},
    {"_dali"},
    {"tracing.trace", "tracing.guards", "tracing.stepcheck"},
    {"codegen.optimize"},
    {"codegen.lower"},
    {"execution.waits", "execution.interpret", "execution.feed", "execution.tuning"},
    {"execution.failures"},
    {"execution.runtime"},
    {"ahead.runahead"},
    {"ahead.streams"},
    {"ahead.speculator"},
    {"ahead.calls"},
    {"ahead.readahead"},
    {"modes.loop"},
    {"modes.report"},
    {"modes.proxies"},
    {"modes.sites"},
    {"modes.regions"},
    {"modes.lazy"},
    {"modes.per_sample"},
    {"modes.cache"},
    {"modes.stage"},
    {"api"},
    {"export"},
    {"__init__", "__main__", "launch"},
    {"nodes"},  # torchdata.nodes (an optional dependency): imported by no module
]
PACKAGES = {"core", "_dali", "tracing", "codegen", "execution", "ahead", "modes"}


def _modules() -> dict[str, str]:
    """Dotted name within the package (`core.ir`, `_dali`, `api`) -> file."""
    found = {}
    for directory, _, files in os.walk(PACKAGE):
        folder = os.path.relpath(directory, PACKAGE).replace(os.sep, ".")
        if "__pycache__" in folder:
            continue
        for file in files:
            if not file.endswith(".py"):
                continue
            name = file[:-3]
            if folder == ".":
                found[name] = os.path.join(directory, file)
            elif name == "__init__":
                found[folder] = os.path.join(directory, file)
            else:
                found[f"{folder}.{name}"] = os.path.join(directory, file)
    return found


def _folder(module: str) -> str:
    head = module.split(".")[0]
    return head if head in PACKAGES else ""


def _layer(module: str) -> int:
    if module in PACKAGES and module != "_dali":  # a folder's __init__: its docstring alone
        return -1
    return next(i for i, layer in enumerate(LAYERS) if module in layer)


def _parse(path: str) -> ast.Module:
    with open(path) as file:
        return ast.parse(file.read())


def _package_of(module: str, path: str) -> list[str]:
    parts = module.split(".")
    return parts if path.endswith("__init__.py") and module in PACKAGES else parts[:-1]


def _imports(module: str, path: str, modules: dict[str, str]) -> set[str]:
    """The package's modules that `module` imports (relative imports, resolved)."""
    found = set()
    for node in ast.walk(_parse(path)):
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        base = _package_of(module, path)
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join([*base, *(node.module.split(".") if node.module else [])])
        for alias in node.names:
            candidate = f"{target}.{alias.name}" if target else alias.name
            found.add(candidate if candidate in modules else target or "__init__")
    return found


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_imports_point_down():
    modules = _modules()
    for module, path in modules.items():
        for imported in _imports(module, path, modules):
            assert FOLDERS.index(_folder(imported)) <= FOLDERS.index(_folder(module)), (
                f"{module} imports {imported}: a folder above its own")
            assert _layer(imported) <= _layer(module), f"{module} imports {imported}"
            assert imported != module


def test_the_core_knows_nothing_of_dali():
    """core/ imports the standard library, astunparse, numpy and itself: no DALI, no adapter."""
    import sys

    for module, path in _modules().items():
        if _folder(module) != "core":
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            for top in tops:
                assert top in sys.stdlib_module_names or top in ("astunparse", "numpy"), (
                    f"{module} imports {top}")


def test_only_the_adapter_imports_dali():
    for module, path in _modules().items():
        if _folder(module) == "_dali":
            continue
        for node in ast.walk(_parse(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                else [])
            assert not any(n.startswith("nvidia") for n in names), f"{module} imports {names}"


def test_the_layout_is_what_the_readme_shows():
    with open(os.path.join(os.path.dirname(PACKAGE), "README.md")) as file:
        readme = file.read()
    for folder in PACKAGES:
        assert f"{folder}/" in readme, f"README.md's layout section does not show {folder}/"
