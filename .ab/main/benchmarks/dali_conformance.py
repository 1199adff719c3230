"""Run DALI's own dynamic-mode tests plain and under `ndd_trace.enable()`, and list what differs.

    python benchmarks/dali_conformance.py /path/to/dali/tests [--timeout 120] [-k EXPR] [--json F]
        [--modules test_a.py,test_b.py]

The folder holds DALI's tests (NVIDIA/DALI dali/test/python/experimental_mode/ and the helpers they
import); it is not part of this repository. pytest runs over it twice, each time in a fresh process:
plain, then with a plugin that calls `ndd_trace.enable()` before each test and
`ndd_trace.disable()` + `ndd_trace.reset_report()` after it. The ndd_trace imported is the one on
PYTHONPATH (set PYTHONPATH to the checkout under test). Printed: how many tests pass plain, how many
pass under ndd_trace, and every test that passes plain and fails under ndd_trace with the one-line
reason. Tests that fail plain (GPU-only ones on a CPU machine, ...) are counted and left out.
A per-test timeout needs pytest-timeout (`pip install pytest-timeout`); without it none is set.
Tests reading DALI_extra (`get_dali_extra_path()`) run with a stand-in folder: `db/single/jpeg`
filled by `benchmarks._data.make_jpeg_dir` plus an `image_list.txt` of `path label` lines, and
`db/imgproc/alley.png` (any PNG); point DALI_EXTRA_PATH at it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

PLUGIN_NAME = "ndd_trace_conformance_plugin"

PLUGIN_SOURCE = '''\
"""pytest plugin: every test runs with ndd_trace's transparent mode switched on."""

import os

import pytest

_switched_on = 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    global _switched_on
    import ndd_trace

    ndd_trace.enable()
    _switched_on += ndd_trace.is_enabled()


def pytest_sessionfinish(session):
    with open(os.environ["NDD_TRACE_CONFORMANCE_COUNT"], "w") as f:
        f.write(str(_switched_on))


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    import ndd_trace

    ndd_trace.disable()
    ndd_trace.reset_report()
'''


def run_mode(suite: str, mode: str, workdir: str, args: argparse.Namespace) -> dict[str, tuple]:
    """All test modules in one mode, each module in its own fresh pytest process (a GPU-only test
    failing on a CPU machine can leave DALI's global state broken for the modules after it)."""
    results = {}
    modules = sorted(f for f in os.listdir(suite) if f.startswith("test_") and f.endswith(".py") and f != "test_utils.py")
    if args.modules:
        modules = [m for m in modules if m in args.modules.split(",")]
    start = time.monotonic()
    for module in modules:
        results.update(run_pytest(suite, module, mode, workdir, args))
    print(f"[{mode}] {len(modules)} modules, {len(results)} tests in "
          f"{time.monotonic() - start:.0f} s", file=sys.stderr)
    return results


def run_pytest(
    suite: str, module: str, mode: str, workdir: str, args: argparse.Namespace
) -> dict[str, tuple]:
    """One pytest run in a fresh process; returns {test id: (outcome, one-line reason)}."""
    junit = os.path.join(workdir, f"{mode}-{module}.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN",
           f"--junitxml={junit}", "-o", "junit_family=xunit1", module]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += [f"--timeout={args.timeout}"]
    if args.k:
        cmd += ["-k", args.k]
    env = dict(os.environ)
    if mode == "ndd_trace":
        cmd += ["-p", PLUGIN_NAME]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [workdir, env.get("PYTHONPATH")]))
        env["NDD_TRACE_CONFORMANCE_COUNT"] = os.path.join(workdir, f"switched_on-{module}")
    proc = subprocess.run(cmd, check=False, cwd=suite, env=env, capture_output=True,
                          text=True)
    if mode == "ndd_trace" and os.path.exists(env.get("NDD_TRACE_CONFORMANCE_COUNT", "")):
        with open(env["NDD_TRACE_CONFORMANCE_COUNT"]) as f:
            print(f"[{mode}] {module}: ndd_trace was on in {f.read()} tests", file=sys.stderr)
    if proc.returncode not in (0, 1, 5) or not os.path.exists(junit):
        # A crash (signal, internal error): the tests it did not report count as not passed.
        print(f"[{mode}] {module}: pytest exited {proc.returncode}\n{proc.stdout[-2000:]}\n"
              f"{proc.stderr[-2000:]}", file=sys.stderr)
        if not os.path.exists(junit):
            return {}
    return parse_junit(junit)


def parse_junit(path: str) -> dict[str, tuple]:
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        test_id = f"{module}.py::{case.get('name')}"
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                reason = one_line(node.get("message") or node.text or "")
                break
        # An error in teardown after a pass still counts as a failure (last entry wins).
        if results.get(test_id, ("passed",))[0] == "passed" or outcome == "failed":
            results[test_id] = (outcome, reason)
    return results


def one_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:200]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", help="folder of DALI's dynamic-mode tests (and their helpers)")
    parser.add_argument("--timeout", type=int, default=120, help="per-test timeout (s)")
    parser.add_argument("-k", default="", help="pytest -k expression")
    parser.add_argument("--modules", default="",
                        help="comma-separated test files to run (default: all test_*.py)")
    parser.add_argument("--json", default="", help="also write the results to this JSON file")
    args = parser.parse_args()
    suite = os.path.abspath(args.suite)

    with tempfile.TemporaryDirectory(prefix="dali_conformance_") as workdir:
        with open(os.path.join(workdir, PLUGIN_NAME + ".py"), "w") as f:
            f.write(PLUGIN_SOURCE)
        plain = run_mode(suite, "plain", workdir, args)
        traced = run_mode(suite, "ndd_trace", workdir, args)

    def passing(results: dict) -> set:
        return {t for t, (outcome, _) in results.items() if outcome == "passed"}

    regressions = sorted(passing(plain) - passing(traced))
    fixed = sorted(passing(traced) - passing(plain))
    plain_failed = sorted(t for t, (o, _) in plain.items() if o == "failed")
    print(f"tests: {len(plain)}  (plain: {len(plain_failed)} failed, "
          f"{sum(o == 'skipped' for o, _ in plain.values())} skipped; left out)")
    print(f"passing plain:           {len(passing(plain))}")
    print(f"passing under ndd_trace: {len(passing(traced))}")
    print(f"pass plain, fail under ndd_trace: {len(regressions)}")
    for test in regressions:
        outcome, reason = traced.get(test, ("missing", "not run under ndd_trace"))
        print(f"  {test}: {reason or outcome}")
    if fixed:
        print(f"fail plain, pass under ndd_trace: {len(fixed)}: {', '.join(fixed)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"plain": plain, "ndd_trace": traced, "regressions": regressions}, f,
                      indent=1)


if __name__ == "__main__":
    main()
