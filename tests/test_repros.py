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

# folder/script -> the issue that fixes it (issue 35: zero differences)
NOT_FIXED_YET = {
    "guards_errors/01_error_text_after_three_failures.py": "issue 35: errors",
    "guards_errors/02_partial_global_stale.py": "issue 35: guards",
    "guards_errors/03_len_of_lazy_batch_internal_exception.py": "issue 35: lazy values",
    "guards_errors/04_bound_method_global_stale.py": "issue 35: guards",
    "guards_errors/05_function_defaults_changed_stale.py": "issue 35: guards",
    "guards_errors/06_numpy_array_static_arg_compiled_only.py": "issue 35: errors",
    "guards_errors/07_layout_error_deferred_in_compiled.py": "issue 35: errors",
    "guards_errors/08_lazy_repr_and_type.py": "issue 35: lazy values",
    "guards_errors/09_np_float64_and_float_share_guard.py": "issue 35: guards",
    "reliability/01_cache_foreign_owned_pickle_runs.py": "issue 35: the cache's trust boundary",
    "reliability/02_export_full_disk_loses_previous.py": "issue 35: atomic writes",
    "reliability/03_tuning_lock_unavailable_loses_entries.py": "issue 35: atomic writes",
    "reliability/04_export_bytes_path.py": "issue 35: atomic writes",
    "reliability/05_report_spawn_child_overwritten.py": "issue 35: atomic writes",
    "training4/01_normalize_scalar_in_variable.py": "issue 35: errors",
    "training4/02_uncaught_error_type_name.py": "issue 35: errors",
    "training4/04_len_of_batch.py": "issue 35: lazy values",
    "training4/05_list_of_batch.py": "issue 35: lazy values",
    "training4/06_lazy_batch_repr.py": "issue 35: lazy values",
}


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
