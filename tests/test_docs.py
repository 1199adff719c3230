"""Every ```python block of README.md and docs/*.md runs, and the docs site builds.

The blocks of one page run in order in one namespace, as a reader would paste them, after a
setup that gives the names pages take for granted: `root`/`image_dir` (a folder of real JPEGs),
`jpegs` (a batch of them, encoded), `batch` (8 uint8 HWC images), `reader`, `train_step`, ...
A block preceded by `<!-- skip-test -->` is not run; one preceded by `<!-- raises: Name -->`
must raise that exception. Without a GPU, `device="gpu"` runs as `device="cpu"`.
"""

from __future__ import annotations

import builtins
import html
import glob
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from conftest import HAS_GPU, ROOT

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace

PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT)
                              for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
_FENCE = re.compile(r"^(?P<indent> *)```python\n(?P<code>.*?)^(?P=indent)```", re.S | re.M)
_MARK = re.compile(r"<!--\s*(skip-test|raises:\s*(\w+))\s*-->\s*$")

# Blocks of other pages a page refers to ("augment and batch from guide.md"): (page, block #).
SETUP_BLOCKS = {
    os.path.join("docs", "debugging.md"): [(os.path.join("docs", "guide.md"), 2),
                                           (os.path.join("docs", "graph-breaks.md"), 0)],
}


def blocks(page: str) -> list[tuple[int, str, str | None]]:
    """(line, dedented code, mark) of each python block of `page`."""
    with open(os.path.join(ROOT, page)) as file:
        text = file.read()
    found = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n ").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        kind = None if mark is None else (mark.group(2) or mark.group(1))
        line = text[:match.start()].count("\n") + 2
        found.append((line, textwrap.dedent(match.group("code")), kind))
    return found


def _setup(jpeg_dir) -> dict:
    rng = np.random.default_rng(0)
    batch = ndd.as_batch(
        [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for _ in range(8)], layout="HWC")
    jpegs = next(iter(ndd.readers.File(file_root=str(jpeg_dir)).next_epoch(batch_size=8)))[0]
    return {
        "__name__": "__main__", "np": np, "ndd": ndd, "ndd_trace": ndd_trace,
        "root": str(jpeg_dir), "image_dir": str(jpeg_dir), "jpegs": jpegs, "batch": batch,
        "reader": ndd.readers.File(file_root=str(jpeg_dir), random_shuffle=True, seed=3),
        "train_step": lambda *tensors: None, "epochs": 2,
        "batches_of_images": [batch, batch],
    }


def _run_block(namespace: dict, code: str, filename: str) -> None:
    if not HAS_GPU:
        code = code.replace('device="gpu"', 'device="cpu"')
    with open(filename, "w") as file:  # a real file: tracebacks and inspect see the source
        file.write(code)
    exec(compile(code, filename, "exec"), namespace)


def test_every_page_has_blocks_found():
    assert sum(len(blocks(page)) for page in PAGES) >= 25
    assert all(code.strip() for page in PAGES for _, code, _ in blocks(page))


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)])
def test_doc_blocks_run(page, jpeg_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks may write files (checkpoints)
    namespace = _setup(jpeg_dir)
    logger_state = {name: logging.getLogger(name).level
                    for name in ["", "ndd_trace", *(f"ndd_trace.{c}" for c in
                                                    ndd_trace.core.logs.CHANNELS)]}
    root_handlers = list(logging.getLogger().handlers)
    ndd.random.set_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ndd_trace.NddTraceWarning)
            for number, (other, index) in enumerate(SETUP_BLOCKS.get(page, [])):
                _, code, _ = blocks(other)[index]
                _run_block(namespace, code, str(tmp_path / f"setup{number}.py"))
            for line, code, mark in blocks(page):
                if mark == "skip-test":
                    continue
                filename = str(tmp_path / f"{os.path.basename(page)[:-3]}_line{line}.py")
                if mark is None:
                    _run_block(namespace, code, filename)
                    continue
                expected = getattr(ndd_trace, mark, None) or getattr(builtins, mark)
                with pytest.raises(expected):
                    _run_block(namespace, code, filename)
    finally:
        ndd_trace.disable()
        for name, level in logger_state.items():
            logging.getLogger(name).setLevel(level)
        logging.getLogger().handlers[:] = root_handlers


def test_skips_are_rare():
    marks = [mark for page in PAGES for _, _, mark in blocks(page)]
    assert marks.count("skip-test") <= 3, "give blocks the setup they need instead"


@pytest.mark.skipif(shutil.which("mkdocs") is None and not os.path.exists(
    os.path.join(os.path.dirname(sys.executable), "mkdocs")),
    reason="needs mkdocs (pip install -e '.[docs]')")
def test_docs_site_builds_strict(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    api = (tmp_path / "api" / "index.html").read_text()
    for name in ndd_trace.__all__:
        assert f'id="ndd_trace.{name}"' in api, name
    # a compiled function's tools, each once; compile's typed forms; each error class once
    for member in ("cache_info", "cache_clear", "entries", "cache_limit", "last_miss_reason"):
        assert api.count(f'id="ndd_trace.CompiledFunction.{member}"') == 1, member
    text = html.unescape(re.sub(r"<[^>]+>", "", api))
    assert "-> CompiledFunction[P, R]" in text and "-> Decorator" in text
    assert api.count('id="ndd_trace.LoopError"') + api.count('id="ndd_trace.core.errors.LoopError"') \
        == 1
    assert "__reduce__" not in api and "GeneratorEpochs" not in api
    assert (tmp_path / "img" / "ratios.png").exists()
