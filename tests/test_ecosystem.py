"""Launchers and switches (-m, NDD_TRACE=1, NDD_TRACE_REPORT), logging, readable keys, reports."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from conftest import ROOT, subprocess_env
from harness import assert_same, to_numpy

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace.tracing import guards, plans
from ndd_trace import launch
from ndd_trace.core import keys, logs

SCRIPT = """\
import sys
import numpy as np
import nvidia.dali.experimental.dynamic as ndd

batch = ndd.as_batch([np.full((6, 8, 3), i, np.uint8) for i in range(4)], layout="HWC")
out = ndd.flip(ndd.resize(batch, size=[4, 4]), horizontal=1) * 2
recording = getattr(sys.modules.get("ndd_trace"), "is_enabled", lambda: False)()
print(__name__, sys.argv[1:], type(out).__name__, recording, int(np.asarray(out.select(3)).sum()))
"""


def _python(arguments: list[str], cwd, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *arguments], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=subprocess_env(**env))


def _with_pth(tmp_path, script: str, *args: str) -> list[str]:
    """Run `script` in a child that first reads ndd_trace.pth from a site directory, as Python
    does at start-up for the installed package (regular or editable install)."""
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(os.path.join(ROOT, "ndd_trace.pth"), site_dir / "ndd_trace.pth")
    start = (f"import site, sys, runpy; site.addsitedir({str(site_dir)!r}); "
             f"sys.argv = [{script!r}, *{list(args)!r}]; "
             f"runpy.run_path({script!r}, run_name='__main__')")
    return ["-c", start]


# -- python -m ndd_trace -m module ----------------------------------------------------------------

def test_launcher_runs_a_module_like_python_m(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(SCRIPT)
    plain = _python(["-m", "mypkg.train", "--epochs", "2"], tmp_path)
    traced = _python(["-m", "ndd_trace", "--report", "-m", "mypkg.train", "--epochs", "2"],
                     tmp_path)
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert plain.stdout.split()[:2] == traced.stdout.split()[:2] == ["__main__", "['--epochs',"]
    assert plain.stdout.split()[-1] == traced.stdout.split()[-1]  # the same values
    # transparent mode recorded it, and its value is eager's type
    assert traced.stdout.split()[-3:-1] == ["Batch", "True"]
    assert plain.stdout.split()[-3:-1] == ["Batch", "False"]
    assert "ndd_trace report" in traced.stderr and "train.py:6" in traced.stderr


def test_launcher_module_errors_like_python_m(tmp_path):
    traced = _python(["-m", "ndd_trace", "-m", "no_such_module_here"], tmp_path)
    assert traced.returncode != 0 and "no_such_module_here" in traced.stderr


# -- NDD_TRACE=1 ----------------------------------------------------------------------------------

def test_ndd_trace_env_enables_transparent_mode_without_code_change(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    plain = _python(_with_pth(tmp_path, str(script), "a"), tmp_path)
    switched = _python(_with_pth(tmp_path, str(script), "a"), tmp_path, NDD_TRACE="1")
    assert plain.returncode == switched.returncode == 0, switched.stderr
    assert plain.stdout.split() == ["__main__", "['a']", "Batch", "False", plain.stdout.split()[-1]]
    assert switched.stdout.split()[2:4] == ["Batch", "True"]
    assert switched.stdout.split()[-1] == plain.stdout.split()[-1]


@pytest.mark.parametrize("value", [None, "0", "off"])
def test_ndd_trace_env_unset_imports_nothing(tmp_path, value, monkeypatch):
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint(sorted(m for m in sys.modules if m == 'ndd_trace' or "
                      "m.startswith(('ndd_trace.', '_ndd_trace'))))\n")
    monkeypatch.delenv("NDD_TRACE", raising=False)
    env = {"NDD_TRACE": value} if value is not None else {}
    completed = _python(_with_pth(tmp_path, str(script)), tmp_path, **env)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


def test_ndd_trace_env_waits_for_dali(tmp_path):
    """Set, the hook imports nothing heavy until the process imports DALI's dynamic mode."""
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint('ndd_trace' in sys.modules, 'nvidia' in sys.modules)\n")
    completed = _python(_with_pth(tmp_path, str(script)), tmp_path, NDD_TRACE="1")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["False", "False"]


def test_ndd_trace_env_with_ndd_trace_imported_first(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import ndd_trace\n" + SCRIPT)
    switched = _python(_with_pth(tmp_path, str(script)), tmp_path, NDD_TRACE="1")
    assert switched.returncode == 0, switched.stderr
    assert switched.stdout.split()[2:4] == ["Batch", "True"]


def test_ndd_trace_report_one_file_per_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    report = tmp_path / "out" / "report.json"
    for rank in ("0", "1"):
        completed = _python(_with_pth(tmp_path, str(script)), tmp_path, NDD_TRACE="1",
                            NDD_TRACE_REPORT=str(report), RANK=rank, LOCAL_RANK=rank)
        assert completed.returncode == 0, completed.stderr
    for rank in ("0", "1"):
        data = json.loads((tmp_path / "out" / f"report.rank{rank}.json").read_text())
        assert data["rank"] == rank and data["ops_recorded"] == 3 and data["regions"]
    assert not report.exists()


def test_launcher_writes_ndd_trace_report_per_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    completed = _python(["-m", "ndd_trace", "--report-json", str(tmp_path / "explicit.json"),
                         str(script)], tmp_path, NDD_TRACE_REPORT=str(tmp_path / "env.json"),
                        RANK="1")
    assert completed.returncode == 0, completed.stderr
    for name in ("explicit.rank1.json", "env.rank1.json"):
        assert json.loads((tmp_path / name).read_text())["ops_recorded"] == 3


def test_report_path_naming(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert launch.report_path("r.json") == "r.json"
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert launch.report_path("out/r.json") == "out/r.rank2.json"
    monkeypatch.setenv("RANK", "5")  # the global rank wins
    assert launch.report_path("r") == "r.rank5"
    assert launch.report_path("r-{rank}.json") == "r-5.json"


def test_torchrun_with_ndd_trace_env(tmp_path):
    """`NDD_TRACE=1 torchrun ...`: each rank's fresh interpreter reads ndd_trace.pth (from a site
    directory a sitecustomize adds here, as site-packages would hold it once installed)."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("needs torchrun (torch)")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    site_dir, startup = tmp_path / "site", tmp_path / "startup"
    site_dir.mkdir()
    startup.mkdir()
    shutil.copy(os.path.join(ROOT, "ndd_trace.pth"), site_dir / "ndd_trace.pth")
    (startup / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site_dir)!r})\n")
    env = subprocess_env(NDD_TRACE="1", NDD_TRACE_REPORT=str(tmp_path / "report.json"))
    env["PYTHONPATH"] = os.pathsep.join([str(startup), env["PYTHONPATH"]])
    # --standalone: a free rendezvous port (the default port may be taken on a busy machine)
    completed = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", str(script)],
                               cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.count("Batch True") == 2, completed.stdout
    assert {p.name for p in tmp_path.glob("report*.json")} == {"report.rank0.json",
                                                                "report.rank1.json"}


# -- logging --------------------------------------------------------------------------------------

def test_logs_trace_recompile_break_and_build(caplog, batch):
    @ndd.compile
    def scaled(images, size):
        return ndd.resize(images, size=[size, size])

    @ndd.compile
    def needs_shape(images):
        return ndd.crop(images, crop=(images.shape[0][0] // 2, 4))

    ndd_trace.reset_report()  # (a region of an earlier test's would be found, not made)
    with caplog.at_level(logging.DEBUG, logger="ndd_trace"):
        scaled(batch, 8).evaluate()
        scaled(batch, 6).evaluate()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ndd_trace.NddTraceWarning)
            needs_shape(batch).evaluate()
    by_channel: dict[str, list[str]] = {}
    for record in caplog.records:
        by_channel.setdefault(record.name, []).append(record.getMessage())
    assert any("first call" in m for m in by_channel["ndd_trace.trace"])
    assert any("`test_logs_trace_recompile_break_and_build.<locals>.scaled` traced: 1 ndd calls"
               in m for m in by_channel["ndd_trace.trace"])
    recompile = by_channel["ndd_trace.recompiles"]
    assert len(recompile) == 1 and "size: 8 -> 6" in recompile[0]
    assert any("reads `.shape`" in m for m in by_channel["ndd_trace.breaks"])
    assert any("transparent mode" in m for m in by_channel["ndd_trace.fallbacks"])
    assert any(m.startswith("built <ndd_trace:") and " ms" in m
               for m in by_channel["ndd_trace.builds"])
    assert any("new region" in m for m in by_channel["ndd_trace.transparent"])
    # `+runtime` adds each run, as debugging.md says (a debug line dropped in an earlier
    # session to fit a class budget, found in this session's review)
    assert sum("pipeline run scheduled" in m for m in by_channel["ndd_trace.runtime"]) >= 2


def test_logs_parse():
    assert logs.parse("recompiles,breaks") == {"recompiles": logging.INFO,
                                                "breaks": logging.INFO}
    assert logs.parse(" +builds ; -runtime,recompile") == {
        "builds": logging.DEBUG, "runtime": logging.ERROR, "recompiles": logging.INFO}
    assert logs.parse("all") == dict.fromkeys(logs.CHANNELS, logging.INFO)
    assert logs.parse("+all,-trace")["trace"] == logging.ERROR
    assert logs.parse("") == {}
    with pytest.raises(ValueError, match="unknown channel 'recompil'.*known: all, trace"):
        logs.parse("recompil")


def test_logs_environment_variable(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""\
        import numpy as np
        import nvidia.dali.experimental.dynamic as ndd
        import ndd_trace

        @ndd.compile
        def scaled(images, size):
            return ndd.resize(images, size=[size, size])

        batch = ndd.as_batch([np.zeros((6, 8, 3), np.uint8)] * 2, layout="HWC")
        scaled(batch, 4).evaluate()
        scaled(batch, 2).evaluate()
        """))
    completed = _python([str(script)], tmp_path, NDD_TRACE_LOGS="recompiles,+builds")
    assert completed.returncode == 0, completed.stderr
    lines = completed.stderr.splitlines()
    assert sum(line.startswith("[ndd_trace.recompiles] ") for line in lines) == 1
    assert sum(line.startswith("[ndd_trace.builds] built") for line in lines) == 2
    assert not any(line.startswith("[ndd_trace.trace]") for line in lines)
    quiet = _python([str(script)], tmp_path)
    assert "[ndd_trace" not in quiet.stderr
    typo = _python([str(script)], tmp_path, NDD_TRACE_LOGS="recompil")
    assert typo.returncode == 0 and "unknown channel 'recompil'" in typo.stderr


# -- readable keys and reports --------------------------------------------------------------------

def test_guards_print_floats_as_written():
    key_a = guards.build_key((0.1, 128.0), {}, plans.plan_for(lambda a, b: None), None, ("a", "b"))
    key_b = guards.build_key((0.1, 120.5), {}, plans.plan_for(lambda a, b: None), None, ("a", "b"))
    assert keys.explain_miss(key_b, key_a) == \
        "b: 128.0 -> 120.5"
    assert "0x1" not in repr(key_a) and keys.show(key_a[0][1]) == "0.1"

    def freeze(value):
        return keys.freeze(value, guards.GUARDS)

    assert freeze(-0.0) != freeze(0.0)
    assert freeze(math.nan) == freeze(float("nan"))
    assert freeze(np.float64(2.5)) != freeze(2.5)  # numpy scalars keep their dtype (eager does)
    assert keys.show(freeze(np.float32(0.1))) == "numpy <f4 0.10000000149011612"
    assert freeze(np.float32(-0.0)) != freeze(np.float32(0.0))


def test_float_miss_reason_of_a_compiled_function(batch):
    @ndd.compile
    def bright(images, factor):
        return images * factor

    bright(batch, 1.5)
    bright(batch, 0.25)
    assert bright.last_miss_reason == \
        "factor: 1.5 -> 0.25"


def test_report_tells_regions_at_one_line_apart(batch):
    # copies: an op given user data as it is would run at its call, as its own region
    batch = ndd.batch(batch)
    floats = ndd.batch([np.ones((8, 8, 3), np.float32)] * 4, layout="HWC")

    def step(x, size):
        # (numbers written at the call are static arguments; a parameter's would be data, as
        # eagerly, and one region would serve both sizes)
        rs = ndd.resize  # (both calls at one line)
        resized = rs(x, resize_x=8, resize_y=8) if size == 8 else rs(x, resize_x=16, resize_y=16)
        return ndd.flip(resized, horizontal=1)

    ndd_trace.reset_report()
    with ndd_trace.enabled():
        for x, size in [(batch, 16), (batch, 16), (batch, 8), (floats, 16)]:
            step(x, size).evaluate()
    report = ndd_trace.report()
    ndd_trace.reset_report()
    assert len(report.regions) == 3 and len({str(r.loc) for r in report.regions}) == 1
    assert {r.op_chain for r in report.regions} == {"resize[cpu] -> flip[cpu]"}
    text = str(report)
    assert "split by: (the first region there)" in text
    assert "split by: op resize[cpu](in0, resize_x=16, resize_y=16)  ->  op resize[cpu](in0, " \
        "resize_x=8, resize_y=8)" in text
    assert "split by: input in0: batch<cpu, UINT8, ndim=3, HWC>  ->  input in0: " \
        "batch<cpu, FLOAT, ndim=3, HWC>" in text
    regions = report.as_dict()["regions"]
    assert {r["split_by"] for r in regions} >= {"(the first region there)"}
    assert all(r["op_chain"] == "resize[cpu] -> flip[cpu]" and r["inputs"] for r in regions)


def test_report_single_region_per_line_stays_short(batch):
    ndd_trace.reset_report()
    with ndd_trace.enabled():
        for _ in range(2):
            ndd.flip(batch, horizontal=1).evaluate()
    text = str(ndd_trace.report())
    ndd_trace.reset_report()
    assert "split by" not in text and "ops:" not in text


def test_sync_eval_mode_does_not_analyse_ndd_trace_source(batch, monkeypatch):
    """DALI's eager call-site analysis (a libcst parse of the calling module) must look at the
    user's line, as a plain eager call does, never at ndd_trace's own modules (1-2 s)."""
    from nvidia.dali.experimental.dynamic import _source_analysis

    analysed = []
    original = _source_analysis._get_module_info

    def spy(code, *args, **kwargs):
        analysed.append(code.co_filename)
        return original(code, *args, **kwargs)

    monkeypatch.setattr(_source_analysis, "_get_module_info", spy)
    eager = ndd.flip(batch, horizontal=1)
    with ndd_trace.enabled(), ndd.EvalMode.sync_cpu:
        lazy = ndd.flip(batch, horizontal=1)
    assert_same(eager, lazy)
    assert not [f for f in analysed if f.startswith(os.path.join(ROOT, "ndd_trace"))], analysed


def test_recording_analyses_the_users_line_only(batch, monkeypatch):
    """Recording asks DALI's call-site analysis which arguments are constant, as eager ndd
    does: for the frames eager analyses (the user's line; DALI's arithmetic helper, which eager
    analyses too), in transparent mode and compiled functions, never ndd_trace's modules."""
    from nvidia.dali.experimental.dynamic import _source_analysis

    analysed = []
    original = _source_analysis.site_info

    def spy(frame, *args, **kwargs):  # each call site's analysis (memoized per site)
        analysed.append(frame.f_code.co_filename)
        return original(frame, *args, **kwargs)

    monkeypatch.setattr(_source_analysis, "site_info", spy)
    size = [6, 6]

    def step(x):
        return ndd.resize(x, size=size) * 2 + 1

    eager = to_numpy(step(batch))
    eagerly_analysed = set(analysed)
    analysed.clear()
    with ndd_trace.enabled():
        assert_same(eager, to_numpy(step(batch)))
    assert set(analysed) == eagerly_analysed, (analysed, eagerly_analysed)
    analysed.clear()
    assert_same(eager, to_numpy(ndd.compile(step)(batch)))
    assert set(analysed) <= eagerly_analysed and __file__ in analysed, analysed
    assert __file__ in eagerly_analysed
    assert not [f for f in eagerly_analysed if f.startswith(os.path.join(ROOT, "ndd_trace"))]
