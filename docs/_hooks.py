"""mkdocs hooks: the API reference page is generated from `ndd_trace.__all__` (read from the
source, nothing imported), so every public name has its entry; the benchmark charts
(benchmarks/ratios.png, scaling.png and batches.png, made by benchmarks/chart.py), the
measured results (benchmarks/RESULTS.md: the current figures) and their session log
(benchmarks/HISTORY.md) go into the site as img/*.png, results.md and history.md, without
copies in docs/.
"""

from __future__ import annotations

import ast
import logging
import os

from mkdocs.structure.files import File

CHARTS = ("ratios.png", "scaling.png", "batches.png")
log = logging.getLogger("mkdocs.hooks.ndd_trace")


def on_files(files, config):
    root = os.path.dirname(config.config_file_path)
    for chart in CHARTS:
        source = os.path.join(root, "benchmarks", chart)
        if os.path.exists(source):
            files.append(File.generated(config, f"img/{chart}", abs_src_path=source))
        else:
            # the build must not fail on a fresh clone before the benchmarks ran: a stand-in
            log.info("benchmarks/%s not found: the site shows a placeholder chart", chart)
            files.append(File.generated(config, f"img/{chart}", content=_PLACEHOLDER))
    files.append(File.generated(config, "api.md", content=_api_page(root)))
    for source, page in SITE_PAGES.items():
        files.append(File.generated(config, page, content=_site_page(root, source)))
    return files


# benchmarks/*.md as pages of the site: the current figures, and the session log apart
SITE_PAGES = {"RESULTS.md": "results.md", "HISTORY.md": "history.md"}


def _site_page(root: str, source: str) -> str:
    """benchmarks/<source> with its links as the site has them: beside the charts and each other
    there, in the site the charts are img/*.png and the pages results.md and history.md."""
    with open(os.path.join(root, "benchmarks", source)) as file:
        text = file.read()
    for chart in CHARTS:
        text = text.replace(f"]({chart})", f"](img/{chart})")
    for name, page in SITE_PAGES.items():
        text = text.replace(f"]({name}", f"]({page}")
    return text


# a 1x1 transparent PNG
_PLACEHOLDER = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6300010000050001"
    "0d0a2db40000000049454e44ae426082")


_API_INTRO = """# API reference

Everything in `ndd_trace.__all__`, from the docstrings. `import ndd_trace` also makes
`ndd.compile` available (the same object as `ndd_trace.compile`); `from ndd_trace import ndd`
is DALI's module with `compile` known to type checkers ([typing.md](typing.md)).
"""

# What a compiled function offers its user (its class's other attributes serve ndd_trace's own
# modules): listed by name, shown with or without a docstring; the compiled function's typed
# call keeps its function's parameters (CompiledFunction[P, R], typing.md).
_COMPILED_FUNCTION = """::: ndd_trace.CompiledFunction
    options:
      show_bases: false
      show_if_no_docstring: true
      members: [cache_info, cache_clear, entries, last_miss_reason, cache_limit, fullgraph,
                optimize, fallback, ledger, step, loop_break]
"""

# A NamedTuple's fields carry no docstrings of their own: listed by name
_CACHE_INFO = """::: ndd_trace.CacheInfo
    options:
      show_if_no_docstring: true
      members: [hits, misses, traces, fallbacks, entries]
"""

_ALSO = """
## Also returned or raised

::: ndd_trace.export.Exported

::: ndd_trace.modes.lazy.Report

::: ndd_trace.modes.lazy.Region

::: ndd_trace.execution.waits.LoopTimes

## torchdata nodes (`ndd_trace.nodes`, needs torchdata)

::: ndd_trace.nodes.Loop

::: ndd_trace.nodes.Loader

::: ndd_trace.nodes.to_torch
"""


def public_names(root: str) -> list[str]:
    """`ndd_trace.__all__`, read from ndd_trace/__init__.py without importing it."""
    with open(os.path.join(root, "ndd_trace", "__init__.py")) as file:
        tree = ast.parse(file.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets):
            return list(ast.literal_eval(node.value))
    raise RuntimeError("ndd_trace/__init__.py defines no __all__")


def identifier(root: str, name: str) -> str:
    """The path mkdocstrings documents public `name` under: `ndd_trace.<name>`, or where a
    submodule has the name too (`ndd_trace.export`, the function, and `ndd_trace/export.py`),
    the object inside it: the reference would otherwise show the module, its CLI `main`
    included."""
    package = os.path.join(root, "ndd_trace")
    if os.path.exists(os.path.join(package, f"{name}.py")) or os.path.isdir(
            os.path.join(package, name)):
        return f"ndd_trace.{name}.{name}"
    return f"ndd_trace.{name}"


def _api_page(root: str) -> str:
    functions = [name for name in public_names(root) if name[0].islower()]
    classes = [name for name in public_names(root) if name[0].isupper()]
    special = {"CompiledFunction": _COMPILED_FUNCTION, "CacheInfo": _CACHE_INFO}
    lines = [_API_INTRO, "## Functions", ""]
    lines += [f"::: {identifier(root, name)}\n" for name in functions]
    lines += ["## Classes and exceptions", ""]
    lines += [special.get(name) or f"::: {identifier(root, name)}\n" for name in classes]
    return "\n".join(lines) + _ALSO
