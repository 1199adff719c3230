"""A user's script type-checks as the user expects: mypy and pyright see a compiled function's
parameters, return type and own methods, in every form of `compile` (docs/typing.md).

One script, checked once by each checker: its lines marked `# error` must be flagged, and no
other line may be. (The script is only checked, not run.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import subprocess_env

SCRIPT = textwrap.dedent('''
    from collections.abc import Iterator
    from typing import assert_type

    import ndd_trace
    from ndd_trace import CacheInfo, ndd
    from ndd_trace.api import Entry


    @ndd.compile                                       # bare, on DALI's module (ndd_trace.ndd)
    def augment(images: ndd.Batch, size: int = 224) -> ndd.Batch:
        return ndd.resize(images, size=[size, size])


    @ndd.compile(fullgraph=True, cache_limit=4)        # with options
    def count(images: ndd.Batch, scale: float = 1.0) -> list[str]:
        return []


    @ndd_trace.compile                                 # bare, from ndd_trace
    def batches(reader: ndd.readers.File, size: int) -> Iterator[tuple[ndd.Batch, int]]:
        for jpegs, labels in reader.next_epoch(batch_size=4):
            yield augment(jpegs, size), 0


    @ndd_trace.compile(fallback="eager", optimize=True)   # a generator, with options
    def epochs(reader: ndd.readers.File) -> Iterator[int]:
        yield 1


    class Model:
        @ndd_trace.compile                             # a method
        def pre(self, images: ndd.Batch, size: int = 3) -> int:
            return size

        @ndd.compile(num_threads=2)                    # a method, with options
        def post(self, images: ndd.Batch) -> str:
            return ""


    def plain(images: ndd.Batch, flip: bool = False) -> tuple[int, str]:
        return 0, ""


    called = ndd_trace.compile(plain)                  # called, not decorating
    per_sample = ndd_trace.compile(plain, per_sample=True)


    def use(batch: ndd.Batch, reader: ndd.readers.File) -> None:
        assert_type(count(batch), list[str])
        assert_type(count(batch, scale=2.0), list[str])
        assert_type(Model().pre(batch), int)
        assert_type(Model().post(batch), str)
        assert_type(called(batch, flip=True), tuple[int, str])
        assert_type(batches(reader, 64), Iterator[tuple[ndd.Batch, int]])
        assert_type(next(epochs(reader)), int)
        assert_type(augment.cache_info(), CacheInfo)
        assert_type(augment.cache_info().hits, int)
        assert_type(augment.entries, list[Entry])
        assert_type(augment.last_miss_reason, str | None)
        assert_type(Model.pre(Model(), batch, size=2), int)     # on the class: unbound
        augment.cache_clear()
        augment.cache_limit = 16
        augment.fullgraph = True
        print(ndd_trace.explain(augment, batch))
        ndd_trace.compile(augment, fallback="eager")   # compiled again, new options
        per_sample(batch)

        augment(batch, sise=3)                         # error
        augment.cache_limitt = 3                       # error
        count(batch, "2.0")                            # error
        assert_type(count(batch), list[int])           # error
        Model().pre(batch, siz=3)                      # error
        Model().post()                                 # error
        called(batch, True, 3)                         # error
        batches(reader)                                # error
        augment.cache_info().hitz                      # error
        ndd_trace.compile(plain, fallback="eagr")      # error
        ndd_trace.compile(plain, per_sample=True, fullgraph=True)  # error
        ndd.compile(cache_limit=2)(plain)(batch, flipp=True)       # error
''')

ERROR_LINES = {number for number, line in enumerate(SCRIPT.splitlines(), 1)
               if line.endswith("# error")}


def _write(tmp_path) -> str:
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT)
    return str(path)


def _run(command: list[str], tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=subprocess_env())


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="needs mypy (pip install -e '.[test]')")
def test_mypy_sees_signatures_and_methods(tmp_path):
    script = _write(tmp_path)
    completed = _run([sys.executable, "-m", "mypy", "--no-incremental", "--no-error-summary",
                      "--hide-error-context", "--show-error-codes", "--python-executable",
                      sys.executable, script], tmp_path)
    output = completed.stdout + completed.stderr
    flagged = {int(match) for match in re.findall(r"user_script\.py:(\d+): error", output)}
    assert flagged == ERROR_LINES, output


@pytest.mark.skipif(importlib.util.find_spec("pyright") is None,
                    reason="needs pyright (pip install -e '.[test]')")
def test_pyright_sees_signatures_and_methods(tmp_path):
    script = _write(tmp_path)
    # the script's interpreter (and so its site-packages and PYTHONPATH); no other settings
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"include": ["user_script.py"]}))
    completed = _run([sys.executable, "-m", "pyright", "--outputjson", "--pythonpath",
                      sys.executable, script], tmp_path)
    try:
        report = json.loads(completed.stdout)
    except json.JSONDecodeError:  # pyright could not start: no node.js and no way to fetch it
        pytest.fail(f"pyright did not run: {completed.stdout[-2000:]} {completed.stderr[-2000:]}")
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    flagged = {d["range"]["start"]["line"] + 1 for d in errors
               if os.path.basename(d["file"]) == "user_script.py"}
    assert flagged == ERROR_LINES, json.dumps(errors, indent=1)
