"""Transparent acceleration of an unmodified ndd script.

    python -m ndd_trace train.py --epochs 3                 # same output as: python train.py ...
    python -m ndd_trace --report train.py                   # plus what was compiled, on stderr
    python -m ndd_trace --report-json report.json train.py  # the same report as JSON

The script runs as `__main__` with its own `sys.argv`; exit codes, exceptions and tracebacks
are those of a plain run. ndd calls are recorded lazily and run as cached pipelines when their
results are consumed (see ndd_trace.lazy).
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys

from . import lazy


def main(argv: list[str] | None = None) -> None:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["export"]:  # python -m ndd_trace export
        from .export import main as export_main
        return export_main((sys.argv[1:] if argv is None else argv)[1:])
    parser = argparse.ArgumentParser(
        prog="python -m ndd_trace",
        description="Run an ndd script with its ndd calls compiled into DALI pipelines.")
    parser.add_argument("--report", action="store_true",
                        help="print what was compiled and what ran eagerly (stderr)")
    parser.add_argument("--report-json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    options = parser.parse_args(argv)

    sys.argv = [options.script, *options.args]
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(
        options.script)))
    lazy.enable()
    try:
        runpy.run_path(options.script, run_name="__main__")
    finally:
        lazy.disable()
        if options.report:
            print(lazy.report(), file=sys.stderr)
        if options.report_json:
            with open(options.report_json, "w") as file:
                json.dump(lazy.report().as_dict(), file, indent=2)


if __name__ == "__main__":
    main()
