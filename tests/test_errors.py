"""Errors read as eager's: the same type, text, moment (the line that raises) and RNG state
afterwards, compiled and in transparent mode; and ndd_trace changes no program's output (its
logs, the tracebacks of `python -m ndd_trace`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import traceback

import pytest
from conftest import subprocess_env

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace


def _python(arguments: list[str], cwd, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *arguments], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=subprocess_env(**env))


# -- the program's output ------------------------------------------------------------------------

LOGGING_SCRIPT = """\
import logging, os, sys
import numpy as np
import nvidia.dali.experimental.dynamic as ndd
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s %(message)s")
if os.environ.get("CHANNEL"):
    logging.getLogger(os.environ["CHANNEL"]).setLevel(logging.INFO)

def preprocess(images):
    return ndd.flip(ndd.resize(images, size=[4, 4]), horizontal=1)

if os.environ.get("COMPILE"):
    import ndd_trace
    preprocess = ndd.compile(preprocess)
batch = ndd.as_batch([np.full((6, 8, 3), 7, np.uint8)] * 2, layout="HWC")
for step in range(2):
    logging.getLogger("train").info("step %d sum %d", step,
                                    int(np.asarray(preprocess(batch).select(0)).sum()))
"""


def test_root_logger_at_info_prints_no_ndd_trace_lines(tmp_path):
    """`logging.basicConfig(level=logging.INFO)`: the script's own lines only, plain, compiled
    and under `python -m ndd_trace`; a level set on an ndd_trace logger switches it on."""
    script = tmp_path / "train.py"
    script.write_text(LOGGING_SCRIPT)
    plain = _python([str(script)], tmp_path)
    compiled = _python([str(script)], tmp_path, COMPILE="1")
    transparent = _python(["-m", "ndd_trace", str(script)], tmp_path)
    assert plain.returncode == compiled.returncode == transparent.returncode == 0, (
        compiled.stderr + transparent.stderr)
    assert [line[:12] for line in plain.stdout.splitlines()] == ["train step 0", "train step 1"]
    assert compiled.stdout == transparent.stdout == plain.stdout
    asked = _python([str(script)], tmp_path, COMPILE="1", CHANNEL="ndd_trace.builds")
    assert "ndd_trace.builds built" in asked.stdout and "ndd_trace.trace" not in asked.stdout
    everything = _python([str(script)], tmp_path, COMPILE="1", CHANNEL="ndd_trace")
    assert "ndd_trace.trace" in everything.stdout and "ndd_trace.builds" in everything.stdout
    by_environment = _python([str(script)], tmp_path, COMPILE="1", NDD_TRACE_LOGS="builds")
    assert by_environment.stdout == plain.stdout
    assert "[ndd_trace.builds] built" in by_environment.stderr


# -- tracebacks under python -m ndd_trace --------------------------------------------------------

@pytest.mark.parametrize("body", [
    'def configure():\n    raise ValueError("bad config")\n\nconfigure()\n',
    "raise KeyboardInterrupt\n",
    'import sys\nsys.excepthook = lambda kind, value, tb: print("hook", len(__import__('
    '"traceback").extract_tb(tb)), file=sys.stderr)\nraise KeyError(1)\n',
], ids=["error", "keyboard-interrupt", "own-excepthook"])
def test_uncaught_error_prints_as_a_plain_run(tmp_path, body):
    """The whole stderr and the exit status of `python -m ndd_trace script.py` are those of
    `python script.py`: no runpy or ndd_trace frames, the script by its absolute path."""
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "boom.py").write_text("import numpy as np\nimport nvidia.dali.experimental."
                                    "dynamic as ndd\nx = ndd.as_batch([np.zeros(3)])\n" + body)
    plain = _python([os.path.join("app", "boom.py")], tmp_path)
    traced = _python(["-m", "ndd_trace", os.path.join("app", "boom.py")], tmp_path)
    assert plain.returncode != 0
    assert (traced.returncode, traced.stderr) == (plain.returncode, plain.stderr)
    assert "<frozen runpy>" not in traced.stderr


def test_uncaught_error_of_a_module_prints_as_python_m(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text("def run():\n    raise KeyError('missing')\n\nrun()\n")
    plain = _python(["-m", "pkg.main"], tmp_path)
    traced = _python(["-m", "ndd_trace", "-m", "pkg.main"], tmp_path)
    assert (traced.returncode, traced.stderr) == (plain.returncode, plain.stderr) != (0, "")


def test_script_globals_and_sys_path_as_python_gives_them(tmp_path):
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "probe.py").write_text(textwrap.dedent('''\
        """The probe."""
        import sys
        print(sorted((k, type(v).__name__) for k, v in globals().items()))
        print(__file__, __doc__, sys.argv, sys.path[0], sys.path.count(sys.path[0]))
        print(sys.modules["__main__"].__dict__ is globals(), __loader__.name)
        x: int = 1
        print(__annotations__)
        '''))
    plain = _python([os.path.join("app", "probe.py"), "--flag"], tmp_path)
    traced = _python(["-m", "ndd_trace", os.path.join("app", "probe.py"), "--flag"], tmp_path)
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout
    assert str(folder) in plain.stdout


# -- a call DALI rejects, in transparent mode ----------------------------------------------------

def _rejected_call() -> tuple:
    try:
        ndd.resize(ndd.tensor([[1]]), size=[-5, 2])  # a 2-D input: no layout resize takes
    except Exception as error:  # noqa: BLE001 (compared with the other mode's)
        frames = [(os.path.basename(frame.filename).split("-")[0], frame.name, frame.lineno)
                  for frame in traceback.extract_tb(error.__traceback__)]
        return type(error), str(error), error.__context__, error.__cause__, frames
    return ("no error",)


def test_rejected_call_raises_as_eagerly_without_internal_context():
    """The same exception, text and traceback (the eager call's frames only), and no internal
    exception chained as its context."""
    eager = _rejected_call()
    with ndd_trace.enabled():
        transparent = _rejected_call()
    assert eager[0] is ValueError and eager[2] is None
    assert transparent == eager
