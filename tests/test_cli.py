"""`python -m ndd_trace`: its help shows every command, `--version`, a clear error without a
target; and NDD_TRACE_LOGS with an unknown channel keeps the known ones and warns at the
user's `import ndd_trace`."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import subprocess_env

import ndd_trace


def _python(args: list[str], cwd, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=subprocess_env(**env))


def test_help_shows_the_commands(tmp_path):
    completed = _python(["-m", "ndd_trace", "--help"], tmp_path)
    assert completed.returncode == 0, completed.stderr
    help_text = completed.stdout
    assert "python -m ndd_trace export module:function --out PATH" in help_text
    assert "-m module" in help_text and "--version" in help_text and "--report" in help_text
    assert "NDD_TRACE_DEBUG_DIR=dir" in help_text and "NDD_TRACE_DUMP" not in help_text
    export_help = _python(["-m", "ndd_trace", "export", "--help"], tmp_path)
    assert export_help.returncode == 0 and "--format" in export_help.stdout


def test_version(tmp_path):
    completed = _python(["-m", "ndd_trace", "--version"], tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"ndd_trace {ndd_trace.__version__} (DALI 2.")


def test_no_target_is_a_clear_error_not_a_missing_args(tmp_path):
    completed = _python(["-m", "ndd_trace"], tmp_path)
    assert completed.returncode == 2
    assert "give the script to run" in completed.stderr
    assert "are required" not in completed.stderr


def test_the_script_gets_its_own_arguments(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import sys\nprint(sys.argv)\n")
    completed = _python(["-m", "ndd_trace", str(script), "--epochs", "3", "-m", "x"], tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == repr([str(script), "--epochs", "3", "-m", "x"])
    bare = _python(["-m", "ndd_trace", str(script)], tmp_path)  # no arguments of its own
    assert bare.stdout.strip() == repr([str(script)])


def test_an_unknown_log_channel_keeps_the_known_ones_and_warns_at_the_import(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import logging
        import warnings
        warnings.simplefilter("always")
        import ndd_trace
        print({name: logging.getLogger("ndd_trace." + name).level
               for name in ("recompiles", "builds", "trace")})
        """))
    completed = _python([str(script)], tmp_path, NDD_TRACE_LOGS="recompiles,recompil,+builds")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "{'recompiles': 20, 'builds': 10, 'trace': 0}"
    warning = completed.stderr
    assert f"{script}:4: UserWarning: NDD_TRACE_LOGS: unknown channel 'recompil'" in warning
    assert "applied: recompiles, builds (DEBUG)" in warning
    assert "__init__.py" not in warning


def test_mistakes_on_the_command_line_are_said_as_argparse_says_them(tmp_path, monkeypatch,
                                                                     capsys):
    """Found by the twenty-third session's sweep: a folder for --report-json was found only
    after the script had run (an IsADirectoryError traceback, exit 1); a missing script gave a
    traceback where python says "can't open file" and exits 2; export's target without
    :function, a name that is no function, a missing --example, no --example and a missing
    --out folder each printed a traceback. (Run in this process: argparse's exit is the same.)"""
    from ndd_trace import __main__ as launcher

    (tmp_path / "mymod.py").write_text(textwrap.dedent("""\
        import nvidia.dali.experimental.dynamic as ndd
        VALUE = 3
        def pre(x):
            return ndd.flip(x, horizontal=1)
        """))
    (tmp_path / "script.py").write_text("print('ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    cases = {
        ("--report-json", str(tmp_path), "script.py"): "a folder",
        ("missing.py",): "can't open file",  # (python's own words and exit status)
        ("export", "mymod", "--out", "o.py"): "give module:function",
        ("export", "mymod:VALUE", "--out", "o.py"): "has no function VALUE",
        ("export", "mymod:pre", "--example", "missing.npz", "--out", "o.py"): "--example",
        ("export", "mymod:pre", "--out", "o.py"): "--example inputs.npz",
        ("export", "mymod:pre", "--out", "nodir/o.py"): "does not exist",
    }
    (tmp_path / "empty").mkdir()
    cases[("empty",)] = "can't find '__main__' module"  # (exit 1, as python's)
    for arguments, words in cases.items():
        with pytest.raises(SystemExit) as exited:
            launcher.main(list(arguments))
        said = capsys.readouterr()
        assert exited.value.code == (1 if arguments == ("empty",) else 2), arguments
        assert words in said.err, (arguments, said.err)
        assert "ran" not in said.out, arguments
    left = {p.name for p in tmp_path.iterdir()} - {"mymod.py", "script.py", "__pycache__",
                                                   "empty"}
    assert not left, left  # (nothing written: no module, no example inputs, no report)
