"""Transparent acceleration of an unmodified ndd script or module.

    python -m ndd_trace train.py --epochs 3                 # same output as: python train.py ...
    python -m ndd_trace -m mypackage.train --epochs 3       # same as: python -m mypackage.train
    python -m ndd_trace --report train.py                   # plus what was compiled, on stderr
    python -m ndd_trace --report-json report.json train.py  # the same report as JSON
    python -m ndd_trace --report --wait-chart waits.png train.py  # per-step waits (matplotlib)
    python -m ndd_trace export mymodule:augment --out augment_pipeline.py  # see export.py
    python -m ndd_trace --version

The script (or module) runs as `__main__` with its own `sys.argv`; exit codes, exceptions and
tracebacks are those of a plain run. ndd calls are recorded lazily and run as cached pipelines
when their results are consumed (see ndd_trace.modes.lazy). The report ends with each reader loop's
loader verdict: how long its consumer waited for data vs its own step (ndd_trace.execution.waits).
Under a launcher that sets RANK or LOCAL_RANK (torchrun), the JSON report of each rank goes to its
own file (report.rank0.json); NDD_TRACE_REPORT=path writes it too.
"""

from __future__ import annotations

import argparse
import builtins
import io
import os
import platform
import runpy
import sys
import types
from importlib.machinery import SourceFileLoader

from . import __version__, _dali, launch
from .core.source import traceback_entries, traceback_of
from .modes import lazy

_THIS_FILE = os.path.abspath(__file__)


_COMMANDS = """\
commands:
  python -m ndd_trace [options] script.py [args ...]   run a script, its ndd calls compiled
  python -m ndd_trace [options] -m module [args ...]   run a module, as `python -m module`
  python -m ndd_trace export module:function --out PATH [--format python|serialized] ...
                                                       export a compiled function's pipeline
                                                       (`python -m ndd_trace export --help`)

environment: NDD_TRACE_LOGS=recompiles,breaks (logs), NDD_TRACE_REPORT=path (JSON report),
NDD_TRACE_CACHE_DIR=dir (warm starts), NDD_TRACE_DEBUG_DIR=dir (every generated pipeline's
source and graph); docs/launching.md
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ndd_trace", usage="%(prog)s [options] (script.py | -m module) [args ...]"
                                          "\n       %(prog)s export module:function --out PATH ...",
        description="Run an ndd script or module with its ndd calls compiled into DALI "
                    "pipelines (or export a compiled function's pipeline).",
        epilog=_COMMANDS, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=(
        f"ndd_trace {__version__} (DALI {_dali.DALI_VERSION}, Python {platform.python_version()})"))
    parser.add_argument("--report", action="store_true",
                        help="print what was compiled and what ran eagerly (stderr)")
    parser.add_argument("--report-json", metavar="PATH",
                        help="write the report as JSON (one file per rank under torchrun)")
    parser.add_argument("--wait-chart", metavar="PNG",
                        help="write a chart of each reader loop's per-step wait for data "
                             "(needs matplotlib)")
    parser.add_argument("-m", dest="module", action="store_true",
                        help="run a module as `python -m` does (the target is a module name)")
    # the target and its own arguments, taken as they are (its options are not ours)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="script.py | module",
                        help="the script to run (or with -m the module), then its arguments")
    return parser


def main(argv: list[str] | None = None) -> None:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["export"]:  # python -m ndd_trace export ...
        from .export import main as export_main
        return export_main(given[1:])
    parser = _parser()
    options = parser.parse_args(given)
    if not options.command:
        parser.error("give the script to run (script.py [args ...]) or a module (-m module), "
                     "or a command (export)")
    options.target, options.args = options.command[0], options.command[1:]
    if not options.module and not os.path.exists(options.target):  # as `python missing.py`
        print(f"{sys.orig_argv[0]}: can't open file {os.path.abspath(options.target)!r}: "
              "[Errno 2] No such file or directory", file=sys.stderr)
        sys.exit(2)
    if not options.module and os.path.isdir(options.target) and \
            not os.path.exists(os.path.join(options.target, "__main__.py")):
        print(f"{sys.orig_argv[0]}: can't find '__main__' module in "
              f"{os.path.abspath(options.target)!r}", file=sys.stderr)
        sys.exit(1)
    for flag, path in (("--report-json", options.report_json),
                       ("--wait-chart", getattr(options, "wait_chart", None))):
        if path and os.path.isdir(path):  # (said now, not once the script has run)
            parser.error(f"{flag} {path}: a folder; give a file name in it")

    # `python -m ndd_trace` put the current directory first on sys.path, as `python -m mod`
    # does (kept for -m); `python script.py` puts the script's own directory there instead
    # (runpy.run_path puts a directory or zip file's path there)
    sys.argv = [options.target, *options.args]
    script = not options.module and os.path.isfile(options.target)
    if not options.module and not sys.flags.safe_path:
        if sys.path and sys.path[0] in ("", os.getcwd()):
            del sys.path[0]
        if script:
            sys.path.insert(0, os.path.dirname(os.path.realpath(options.target)))
    _dali.call_stacks_start_above(_THIS_FILE)
    lazy.enable()
    launch.write_report_at_exit()  # NDD_TRACE_REPORT, if set
    try:
        if script:
            _run_script(options.target)
        elif options.module:  # (argv[0] becomes the module's file, as with `python -m`)
            runpy.run_module(options.target, run_name="__main__", alter_sys=True)
        else:  # a directory or zip file with a __main__.py
            runpy.run_path(options.target, run_name="__main__")
    except BaseException as error:
        if argv is None and not isinstance(error, SystemExit):  # (the command line's run)
            _print_uncaught_as_python_does(error, keep_runpy=options.module)
        raise
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


def _run_script(path: str) -> None:
    """Run a script as `python script.py` does: its code compiled under its absolute path
    (tracebacks and `__file__` show that), as the `__main__` module with the globals Python
    gives a script, and no compiler flags of this file."""
    filename = os.path.abspath(path)
    with io.open_code(filename) as file:
        source = file.read()
    code = compile(source, filename, "exec", dont_inherit=True)
    if b"dali" in source:  # (its ndd calls' first needs the script's parse: made meanwhile)
        _dali.parse_ahead(code)
    module = types.ModuleType("__main__")
    module.__dict__.update(__package__=None, __loader__=SourceFileLoader("__main__", filename),
                           __spec__=None, __annotations__={}, __builtins__=builtins,
                           __file__=filename, __cached__=None)
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def _print_uncaught_as_python_does(error: BaseException, keep_runpy: bool) -> None:
    """If `error` ends the program, Python prints it through sys.excepthook: give the hook the
    traceback of a plain run, without this launcher's frames (for `-m`, with the two runpy
    frames above them, which `python -m module` shows too)."""
    previous = sys.excepthook

    def excepthook(kind: type, value: BaseException, tb: types.TracebackType | None) -> None:
        sys.excepthook = previous
        if value is error:
            tb = value.__traceback__ = _without_launcher(tb, keep_runpy)
        previous(kind, value, tb)

    sys.excepthook = excepthook


def _without_launcher(tb: types.TracebackType | None,
                      keep_runpy: bool) -> types.TracebackType | None:
    """`tb` without this module's frames and the runpy frames that run the user's code."""
    entries = traceback_entries(tb)

    def launcher(entry: types.TracebackType) -> bool:
        filename = entry.tb_frame.f_code.co_filename
        return filename in (_THIS_FILE, "<frozen runpy>", runpy.__file__)

    first = next((i for i, entry in enumerate(entries)
                  if entry.tb_frame.f_code.co_filename == _THIS_FILE), None)
    if first is None:
        return entries[0] if entries else None
    last = first
    while last < len(entries) and launcher(entries[last]):
        last += 1
    return traceback_of((entries[:first] if keep_runpy else []) + entries[last:])


if __name__ == "__main__":
    main()
