"""The known-difference reproductions in ../shared/repros/ (each prints SAME or MISMATCH) as tests.

Each script runs a scenario plainly and through ndd_trace in a fresh process and exits 1 on a
mismatch. Skipped where the shared folder is not beside the checkout.
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


@pytest.mark.skipif(not SCRIPTS, reason="../shared/repros is not beside this checkout")
@pytest.mark.parametrize("script", SCRIPTS, ids=[os.path.basename(s) for s in SCRIPTS])
def test_repro_prints_same(script):
    result = subprocess.run([sys.executable, os.path.basename(script)],
                            cwd=os.path.dirname(script), env=subprocess_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "SAME" in result.stdout, result.stdout + result.stderr
