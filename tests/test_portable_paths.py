"""Generated and exported code names the user's files as the project does (`pkg/aug.py:7`),
never by this machine's absolute path; tracebacks and warnings still show the real file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import subprocess_env

from ndd_trace.core.source import SourceLoc, portable_path

MODULE = textwrap.dedent("""\
    import nvidia.dali.experimental.dynamic as ndd
    import ndd_trace


    @ndd.compile
    def augment(images, size=8):
        images = ndd.resize(images, size=[size, size])
        return images * 2


    @ndd.compile
    def broken(images):
        return ndd.reshape(images, shape=[5, 5])
    """)

SCRIPT = textwrap.dedent("""\
    import numpy as np
    import nvidia.dali.experimental.dynamic as ndd
    import ndd_trace
    from pkg.aug import augment, broken

    batch = ndd.as_batch([np.zeros((6, 8, 3), np.uint8)] * 2, layout="HWC")
    augment(batch).evaluate()
    print("CODE<<", ndd_trace.explain(augment, batch).code, ">>CODE")
    ndd_trace.export(augment, batch, path="augment_pipeline.py")
    try:
        broken(batch).evaluate()   # an op's error: the traceback shows the source
    except Exception:
        import traceback
        traceback.print_exc()
    """)


def test_generated_and_exported_code_name_files_relative_to_the_project(tmp_path):
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "aug.py").write_text(MODULE)
    (project / "train.py").write_text(SCRIPT)
    completed = subprocess.run([sys.executable, "train.py"], cwd=project, capture_output=True,
                               text=True, timeout=300, env=subprocess_env())
    assert completed.returncode == 0, completed.stderr[-3000:]
    code = completed.stdout.split("CODE<<", 1)[1].split(">>CODE", 1)[0]
    exported = (project / "augment_pipeline.py").read_text()
    for text in (code, exported):
        assert "# pkg/aug.py:7" in text and "# pkg/aug.py:8" in text, text
        assert str(tmp_path) not in text, text
    # the traceback of the failing call still reads the user's file, by its real path
    assert f'File "{project / "pkg" / "aug.py"}", line 13' in completed.stderr, \
        completed.stderr[-3000:]
    assert "return ndd.reshape(images, shape=[5, 5])" in completed.stderr


def test_portable_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert portable_path(str(tmp_path / "src" / "train.py")) == os.path.join("src", "train.py")
    elsewhere = tmp_path.parent / "lib" / "mypkg" / "aug.py"
    monkeypatch.setattr(sys, "path", [str(tmp_path.parent / "lib"), "/"])
    assert portable_path(str(elsewhere)) == os.path.join("mypkg", "aug.py")  # by its module
    assert portable_path("/opt/nowhere/aug.py") == "aug.py"  # ("/" names no module)
    assert portable_path("<stdin>") == "<stdin>"
    assert SourceLoc(str(tmp_path / "a.py"), 3).portable == "a.py:3"
