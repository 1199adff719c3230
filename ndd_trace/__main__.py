"""Transparent acceleration of an unmodified ndd script or module.

    python -m ndd_trace train.py --epochs 3                 # same output as: python train.py ...
    python -m ndd_trace -m mypackage.train --epochs 3       # same as: python -m mypackage.train
    python -m ndd_trace --report train.py                   # plus what was compiled, on stderr
    python -m ndd_trace --report-json report.json train.py  # the same report as JSON
    python -m ndd_trace --report --wait-chart waits.png train.py  # per-step waits (matplotlib)

The script (or module) runs as `__main__` with its own `sys.argv`; exit codes, exceptions and
tracebacks are those of a plain run. ndd calls are recorded lazily and run as cached pipelines
when their results are consumed (see ndd_trace.lazy). The report ends with each reader loop's
loader verdict: how long its consumer waited for data vs its own step (ndd_trace.waits). Under
a launcher that sets RANK or LOCAL_RANK (torchrun), the JSON report of each rank goes to its own
file (report.rank0.json); NDD_TRACE_REPORT=path writes it too.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from . import launch, lazy


def main(argv: list[str] | None = None) -> None:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["export"]:  # python -m ndd_trace export
        from .export import main as export_main
        return export_main((sys.argv[1:] if argv is None else argv)[1:])
    parser = argparse.ArgumentParser(
        prog="python -m ndd_trace",
        description="Run an ndd script or module with its ndd calls compiled into DALI "
                    "pipelines.")
    parser.add_argument("--report", action="store_true",
                        help="print what was compiled and what ran eagerly (stderr)")
    parser.add_argument("--report-json", metavar="PATH",
                        help="write the report as JSON (one file per rank under torchrun)")
    parser.add_argument("--wait-chart", metavar="PNG",
                        help="write a chart of each reader loop's per-step wait for data "
                             "(needs matplotlib)")
    parser.add_argument("-m", dest="module", action="store_true",
                        help="run a module as `python -m` does (the target is a module name)")
    parser.add_argument("target", metavar="script.py | -m module",
                        help="the Python script to run, or with -m the module")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its own arguments")
    options = parser.parse_args(argv)

    if options.module:
        # as `python -m`: the current directory first on sys.path, argv[0] the module's file
        sys.path.insert(0, os.getcwd())
        sys.argv = [options.target, *options.args]
    else:
        sys.argv = [options.target, *options.args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(options.target)))
    lazy.enable()
    launch.write_report_at_exit()  # NDD_TRACE_REPORT, if set
    try:
        if options.module:
            runpy.run_module(options.target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(options.target, run_name="__main__")
    finally:
        lazy.disable()
        if options.report:
            print(lazy.report(), file=sys.stderr)
        if options.report_json:
            launch.write_report(options.report_json)
        if options.wait_chart:
            try:
                lazy.report().chart(options.wait_chart)
            except ImportError as error:
                print(f"ndd_trace: no wait chart: {error}", file=sys.stderr)


if __name__ == "__main__":
    main()
