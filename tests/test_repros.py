"""The known-difference reproductions in ../shared/repros/ (each prints SAME or MISMATCH) as tests.

Each script runs a scenario plainly and through ndd_trace in a fresh process and exits 1 on a
mismatch. Skipped where the shared folder is not beside the checkout. A repro whose fix has not
landed yet is a strict expected failure (listed in NOT_FIXED_YET): it fails the suite once it
passes, so that its mark is dropped as its fix lands.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
from conftest import ROOT, subprocess_env

REPROS = os.path.join(os.path.dirname(ROOT), "shared", "repros")
SCRIPTS = sorted(glob.glob(os.path.join(REPROS, "*", "[0-9][0-9]_*.py")))

# folder/script -> the issue that fixes it (issue 35: zero differences); the project's own
# copies of differences found elsewhere live as tests by behaviour (tests/test_errors.py, ...)
NOT_FIXED_YET: dict[str, str] = {}


def _name(script: str) -> str:
    return f"{os.path.basename(os.path.dirname(script))}/{os.path.basename(script)}"


def _param(script: str) -> object:
    reason = NOT_FIXED_YET.get(_name(script))
    marks = [pytest.mark.xfail(strict=True, reason=f"not fixed yet ({reason})")] if reason else []
    return pytest.param(script, marks=marks, id=_name(script))


@pytest.mark.skipif(not SCRIPTS, reason="../shared/repros is not beside this checkout")
@pytest.mark.parametrize("script", [_param(s) for s in SCRIPTS])
def test_repro_prints_same(script):
    result = subprocess.run([sys.executable, os.path.basename(script)],
                            cwd=os.path.dirname(script), env=subprocess_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "SAME" in result.stdout, result.stdout + result.stderr


def test_every_listed_repro_exists():
    """A mark for a repro that is gone (renamed, deleted) would hide nothing: keep the list true."""
    if not SCRIPTS:
        pytest.skip("../shared/repros is not beside this checkout")
    names = {_name(s) for s in SCRIPTS}
    assert set(NOT_FIXED_YET) <= names, sorted(set(NOT_FIXED_YET) - names)
