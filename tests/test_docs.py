"""Every ```python block of README.md and docs/*.md runs as written, and the docs site builds.

How a page marks its samples (an HTML comment on the line before a block; marks combine with `;`):

- no mark: the block is a program. Pasted alone into a fresh interpreter, it runs. It brings
  its own data: a page's first block makes the images it reads (with numpy, or JPEGs with
  nvImageCodec, which DALI installs), and says where yours go instead.
- `<!-- continues the sample above -->`: the block goes on from the page's previous block, as
  the next lines of the same program (a page read top to bottom is one session). It runs after
  the blocks it continues, in their namespace.
- `<!-- raises: Name -->`: the block raises `Name` (an ndd_trace exception or a built-in one);
  the blocks that continue it run on.
- `<!-- not run: why -->`: shown, never run (what a type checker rejects, the code ndd_trace
  generates). At most three in all.

Each page runs in a fresh process of its own (tests/doc_samples.py: forked from an interpreter
that imported DALI and nothing of ndd_trace; on a GPU machine, an interpreter per page), on the
CPU (`device="gpu"` runs as `device="cpu"` without a GPU), with HOME in a temporary folder; each
program in a fresh namespace and a folder of its own. Nothing is injected: a name a program uses
is one it defines or imports. Where figures go is checked here too (one source: the current
figures of benchmarks/RESULTS.md), and that the site builds with an API reference of every
public name.
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import HAS_GPU, ROOT, subprocess_env

import ndd_trace
from benchmarks import chart

PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT)
                              for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
RUNNER = os.path.join(ROOT, "tests", "doc_samples.py")
CONTINUES = "continues the sample above"
MAX_NOT_RUN = 3

_FENCE = re.compile(r"^(?P<indent> *)```python\n(?P<code>.*?)^(?P=indent)```", re.S | re.M)
_COMMENT = re.compile(r"^\s*<!--\s*(?P<marks>.*?)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the code's first line
    code: str
    continues: bool = False
    raises: str | None = None
    not_run: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _marks(comment: str, where: str) -> dict:
    marks: dict = {}
    for mark in filter(None, (part.strip() for part in comment.split(";"))):
        if mark == CONTINUES:
            marks["continues"] = True
        elif mark.startswith("raises:"):
            marks["raises"] = mark.split(":", 1)[1].strip()
        elif mark.startswith("not run:"):
            marks["not_run"] = mark.split(":", 1)[1].strip() or "?"
        else:
            raise AssertionError(f"{where}: unknown mark <!-- {mark} --> (the marks: "
                                 f"'{CONTINUES}', 'raises: Name', 'not run: why')")
    return marks


def blocks(page: str) -> list[Block]:
    """Each python block of `page`, with the marks of the comment on the line before it."""
    with open(os.path.join(ROOT, page)) as file:
        text = file.read()
    found = []
    for match in _FENCE.finditer(text):
        line = text[:match.start()].count("\n") + 2
        before = text[:match.start()].rstrip("\n ").rsplit("\n", 1)[-1]
        comment = _COMMENT.match(before)
        marks = _marks(comment.group("marks"), f"{page}:{line}") if comment else {}
        found.append(Block(page, line, textwrap.dedent(match.group("code")), **marks))
    return found


def programs(page: str) -> list[list[Block]]:
    """The page's programs: a block without a mark and the blocks that continue it."""
    result: list[list[Block]] = []
    for block in blocks(page):
        if block.not_run:
            continue
        if block.continues:
            assert result, f"{block.where} continues a sample, but none runs before it"
            result[-1].append(block)
        else:
            result.append([block])
    return result


def _imports_ndd_trace(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Import) and any(a.name == "ndd_trace" for a in node.names)
               or isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ndd_trace")
               for node in ast.walk(tree))


def _uses_ndd_trace(tree: ast.Module) -> bool:
    """`ndd.compile` or a name of ndd_trace: works only after `import ndd_trace`."""
    return any(isinstance(node, ast.Attribute) and node.attr == "compile"
               and isinstance(node.value, ast.Name) and node.value.id == "ndd"
               or isinstance(node, ast.Name) and node.id == "ndd_trace"
               for node in ast.walk(tree))


def test_every_page_has_blocks_found():
    assert sum(len(blocks(page)) for page in PAGES) >= 40
    assert all(block.code.strip() for page in PAGES for block in blocks(page))


def test_not_run_blocks_are_rare():
    not_run = [block.where for page in PAGES for block in blocks(page) if block.not_run]
    assert len(not_run) <= MAX_NOT_RUN, f"give these blocks what they need to run: {not_run}"


def test_programs_that_use_ndd_trace_import_it():
    """The runner's programs share an interpreter per page, and `import ndd_trace` adds
    `ndd.compile` to DALI's module for good: a program that relies on an earlier program's
    import would fail for a reader who pastes it alone."""
    missing = []
    for page in PAGES:
        for program in programs(page):
            tree = ast.parse("\n".join(block.code for block in program))
            if _uses_ndd_trace(tree) and not _imports_ndd_trace(tree):
                missing.append(program[0].where)
    assert not missing, f"programs that use ndd_trace without importing it: {missing}"


def _plan(page: str, folder) -> list[list[dict]]:
    plan = []
    for program in programs(page):
        entries = []
        for block in program:
            code = block.code if HAS_GPU else block.code.replace('device="gpu"', 'device="cpu"')
            path = folder / f"{page.replace(os.sep, '_')[:-3]}_line{block.line}.py"
            path.write_text(code)
            entries.append({"file": str(path), "where": block.where, "raises": block.raises})
        plan.append(entries)
    return plan


SAMPLE_PAGES = [page for page in PAGES if programs(page)]


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory) -> dict:
    """Runs the pages this session selected, once: tests/doc_samples.py, in a fresh interpreter
    (a fresh process per page: forked from one that imported DALI; on a GPU machine, one
    interpreter per page)."""
    selected = [item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_page_samples_run"]
    folder = tmp_path_factory.mktemp("doc_samples")
    (folder / "blocks").mkdir()
    plan = {page: _plan(page, folder / "blocks") for page in selected}
    (folder / "plan.json").write_text(json.dumps(plan))
    env = {name: value for name, value in subprocess_env().items()
           if not name.startswith("NDD_TRACE")}  # the samples set what they use themselves
    env["HOME"] = str(folder)  # a sample's ~/.cache/... lands here
    command = [sys.executable, RUNNER, str(folder / "plan.json"), str(folder / "results.json")]
    completed = subprocess.run(command + (["--no-fork"] if HAS_GPU else []), cwd=folder,
                               env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads((folder / "results.json").read_text())


@pytest.mark.parametrize("page", SAMPLE_PAGES)
def test_page_samples_run(page, page_runs):
    """The page's programs ran, each in a fresh namespace, in a fresh process for the page."""
    with open(page_runs[page]["log"]) as file:
        log = file.read()
    assert page_runs[page]["returncode"] == 0, log[-8000:]


# -- one source for each figure -------------------------------------------------------------------

RESULTS = os.path.join(ROOT, "benchmarks", "RESULTS.md")
FIGURE_PAGES = ["README.md", os.path.join("docs", "guide.md"), os.path.join("docs", "benchmarks.md")]
CURRENT_FIGURES = '--8<-- "benchmarks/RESULTS.md:current"'  # pymdownx.snippets' include
_MEASURED_RATIO = re.compile(r"\b\d+\.\d\dx\b")  # as the docs write one: 0.85x
_CELL = re.compile(r"-|\d+\.\d\d|\d+\.\d\d( / \d+\.\d\d)+")


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as file:
        return file.read()


def test_results_open_with_the_current_figures():
    """RESULTS.md opens with one table of every mode, each column's run named in its key; the
    sessions' log is HISTORY.md, linked."""
    text = _read(RESULTS)
    assert re.findall(r"^## (.+)$", text, re.M)[0] == "Current figures"
    header, rows = chart.current_table(RESULTS)
    assert len(rows) >= 10 and all(len(row) == len(header) + 1 for row in rows), rows
    bad = [(row[0], cell) for row in rows for cell in row[1:] if not _CELL.fullmatch(cell)]
    assert not bad, f"cells that are no ratio, `a / b` rounds or `-`: {bad}"
    pipeline = next(row for row in rows if row[0].startswith("`@pipeline_def`, written by hand"))
    assert set(pipeline[1:]) == {"1.00"}, "the ratios are to the hand-written pipeline"
    for session in {column.rsplit(", ", 1)[-1].split()[0] for column in header}:
        assert f"- **{session}**:" in text, f"column run {session} has no key (machine, command, date)"
    assert "](HISTORY.md)" in text and re.search(r"^## .* session", _read(os.path.join(
        "benchmarks", "HISTORY.md")), re.M)
    assert len(text) < 20_000, "RESULTS.md is the current figures; the log goes to HISTORY.md"


def test_the_docs_show_the_current_figures_only():
    """The benchmarks page includes the table; the README and the guide link to it; none of the
    three writes a measured ratio of its own (which is how they came to disagree)."""
    assert _read(os.path.join("docs", "benchmarks.md")).count(CURRENT_FIGURES) == 1
    found = {page: _MEASURED_RATIO.findall(_read(page)) for page in FIGURE_PAGES}
    assert not any(found.values()), f"ratios outside the current figures: {found}"
    assert "benchmarks.md#current-figures" in _read(os.path.join("docs", "guide.md"))


def _png_text(path: str) -> dict[str, str]:
    """The tEXt chunks of a PNG file."""
    with open(path, "rb") as file:
        data = file.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    texts, offset = {}, 8
    while offset < len(data):
        length = int.from_bytes(data[offset:offset + 4], "big")
        kind, body = data[offset + 4:offset + 8], data[offset + 8:offset + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            texts[key.decode("latin-1")] = value.decode("latin-1")
        offset += 12 + length
    return texts


def test_the_chart_is_drawn_from_the_current_figures():
    drawn_from = _png_text(os.path.join(ROOT, "benchmarks", "ratios.png")).get(chart.SOURCE_KEY)
    assert drawn_from == chart.table_digest(RESULTS), \
        "benchmarks/ratios.png was drawn from another table: python benchmarks/chart.py " \
        "--results benchmarks/RESULTS.md (pip install -e '.[bench]')"
    groups, _ = chart.results_groups(RESULTS)
    assert len(groups) >= 3


@pytest.mark.skipif(shutil.which("mkdocs") is None and not os.path.exists(
    os.path.join(os.path.dirname(sys.executable), "mkdocs")),
    reason="needs mkdocs (pip install -e '.[docs]')")
def test_docs_site_builds_strict(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    api = (tmp_path / "api" / "index.html").read_text()
    ids = re.findall(r'id="(ndd_trace\.[^"]+)"', api)
    # every public name once, under the path the hook gives it (a submodule's namesake inside it)
    hooks = _load_hooks()
    for name in ndd_trace.__all__:
        assert ids.count(hooks.identifier(ROOT, name)) == 1, name
    duplicates = sorted({found for found in ids if ids.count(found) > 1})
    assert not duplicates, f"documented twice: {duplicates}"
    private = [found for found in ids if any(part.startswith("_") for part in found.split("."))]
    assert not private, f"private names in the API reference: {private}"
    assert "ndd_trace.export.main" not in ids, "the export module's CLI is no API"
    # a compiled function's tools; compile's typed forms; each error class once
    for member in ("cache_info", "cache_clear", "entries", "cache_limit", "last_miss_reason"):
        assert f"ndd_trace.CompiledFunction.{member}" in ids, member
    text = html.unescape(re.sub(r"<[^>]+>", "", api))
    assert "-> CompiledFunction[P, R]" in text and "-> Decorator" in text
    assert "ndd_trace.core.errors.LoopError" not in ids
    assert "__reduce__" not in api and "GeneratorEpochs" not in api
    assert (tmp_path / "img" / "ratios.png").exists()
    assert (tmp_path / "results" / "index.html").stat().st_size < 100_000  # the table, not the log


def test_the_home_page_names_every_public_name():
    text = _read(os.path.join("docs", "index.md"))
    listed = text[text.index("Public API"):text.index("Requirements:")]
    missing = [name for name in ndd_trace.__all__ if f"`{name}`" not in listed]
    assert not missing, f"docs/index.md's public API lacks {missing}"


def _load_hooks():
    """docs/_hooks.py, which mkdocs loads by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", os.path.join(ROOT, "docs",
                                                                               "_hooks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
