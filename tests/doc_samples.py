"""Runs the programs of the docs pages, each page in a fresh process, each program in a fresh
namespace and folder:

    python tests/doc_samples.py plan.json results.json [--no-fork]

test_docs.py starts it in a fresh interpreter. It imports DALI's dynamic mode once (the bulk of
every page's start-up) and forks a child per page, which imports ndd_trace only if its programs
do: a program that forgets `import ndd_trace` fails as it would for a reader, and what one page
leaves in ndd_trace cannot reach another. With --no-fork (a GPU machine: CUDA and fork do not
mix) each page runs in an interpreter of its own instead.

A plan is `{page: [program, ...]}`, a program a list of blocks `{"file", "where", "raises"}`; a
block's code is read from its file, where tracebacks, `inspect` and DALI's source analysis find
it too. Each page's output goes to `<page folder>/log.txt`: `ok <where>` per block and, at a
failure, the traceback and `FAILED <where>` (its later programs still run). results.json is
`{page: {"returncode", "log"}}`.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import subprocess
import sys
import traceback
import warnings


def _raised(error: BaseException, expected: str) -> bool:
    return any(cls.__name__ == expected for cls in type(error).__mro__)


def _logging_state() -> tuple:
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)]
    return (list(logging.root.handlers), logging.root.level,
            {logger: (logger.level, list(logger.handlers)) for logger in loggers})


def _restore_logging(state: tuple) -> None:
    handlers, level, loggers = state
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)
    for name in list(logging.Logger.manager.loggerDict):
        logger = logging.getLogger(name)
        logger.setLevel(loggers.get(logger, (logging.NOTSET, []))[0])
        logger.handlers[:] = loggers.get(logger, (0, []))[1]


def _forget_ndd_trace_state() -> None:
    """What one program leaves in ndd_trace (transparent mode switched on, compiled functions'
    caches) must not reach the next program of its page."""
    ndd_trace = sys.modules.get("ndd_trace")
    if ndd_trace is not None:
        ndd_trace.disable()
        ndd_trace.reset()


def run_program(blocks: list[dict], folder: str) -> bool:
    """Runs one program's blocks in order in one fresh namespace, in `folder`."""
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    logging_state = _logging_state()
    try:
        with warnings.catch_warnings():
            for block in blocks:
                with open(block["file"]) as file:
                    code = compile(file.read(), block["file"], "exec")
                try:
                    exec(code, namespace)
                except BaseException as error:  # noqa: BLE001 (a sample's error is the finding)
                    if block["raises"] and _raised(error, block["raises"]):
                        print(f"ok {block['where']} (raised {type(error).__name__})", flush=True)
                        continue
                    traceback.print_exc()
                    print(f"FAILED {block['where']}", file=sys.stderr, flush=True)
                    return False
                if block["raises"]:
                    print(f"FAILED {block['where']}: it was to raise {block['raises']} and did "
                          f"not", file=sys.stderr, flush=True)
                    return False
                print(f"ok {block['where']}", flush=True)
    finally:
        _restore_logging(logging_state)
        _forget_ndd_trace_state()
    return True


def run_page(programs: list[list[dict]], folder: str) -> int:
    """The page's programs, in order; 1 if any failed."""
    failed = False
    for number, blocks in enumerate(programs):
        failed |= not run_program(blocks, os.path.join(folder, f"program{number}"))
    return int(failed)


def _forked(programs: list[list[dict]], folder: str, log: str) -> int:
    pid = os.fork()
    if pid == 0:  # the child: its output to the page's log, its status the page's
        status = 1
        try:
            descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(descriptor, 1)
            os.dup2(descriptor, 2)
            status = run_page(programs, folder)
        except BaseException:  # noqa: BLE001 (reported in the log, the child must exit)
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _in_own_interpreter(page_plan: str, folder: str, log: str) -> int:
    with open(log, "w") as output:
        return subprocess.run([sys.executable, __file__, "--page", page_plan, folder],
                              stdout=output, stderr=subprocess.STDOUT, timeout=600).returncode


def main(argv: list[str]) -> int:
    if argv[0] == "--page":  # one page, in this interpreter (--no-fork's children)
        with open(argv[1]) as file:
            return run_page(json.load(file), argv[2])
    plan_path, results_path, *options = argv
    with open(plan_path) as file:
        plan = json.load(file)
    fork = "--no-fork" not in options and hasattr(os, "fork")
    if fork:
        import nvidia.dali.experimental.dynamic  # noqa: F401 (shared by the forked pages)
    root = os.path.dirname(os.path.abspath(plan_path))
    results = {}
    for number, (page, programs) in enumerate(plan.items()):
        folder = os.path.join(root, f"page{number}")
        os.makedirs(folder, exist_ok=True)
        log = os.path.join(folder, "log.txt")
        if fork:
            returncode = _forked(programs, folder, log)
        else:
            page_plan = os.path.join(folder, "plan.json")
            with open(page_plan, "w") as file:
                json.dump(programs, file)
            returncode = _in_own_interpreter(page_plan, folder, log)
        results[page] = {"returncode": returncode, "log": log}
    with open(results_path, "w") as file:
        json.dump(results, file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
