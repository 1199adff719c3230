"""The layering stays one-directional, the folders show it, and only the adapter touches DALI."""

from __future__ import annotations

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ndd_trace")

# The folders, lowest first: a module imports only from its own folder or folders below it.
FOLDERS = ["core", "_dali", "tracing", "codegen", "execution", "units", "ahead", "modes", ""]

# Modules (dotted, within the package), lowest first: each imports only modules of a lower layer
# (or of its own layer, where several are listed together).
LAYERS = [
    {"core.process_state"},
    {"core.source", "core.errors", "core.logs", "core.trees", "core.keys", "core.objects",
     "core.spelling", "core.ledger", "core.files", "core.checks"},
    {"core.ir"},
    {"core.passes"},
    {"_dali.base"},
    {"_dali.analysis"},
    {"_dali.operators"},
    {"_dali.interception"},
    {"_dali.data"},
    {"_dali.random"},
    {"_dali.readers"},
    {"_dali.pipelines"},
    {"_dali.conditionals"},
    {"_dali"},
    {"tracing.writes"},
    {"tracing.code_writes", "tracing.imports", "tracing.aliasing"},
    {"tracing.values", "tracing.effects", "tracing.reads"},
    {"tracing.plans"},
    {"tracing.trace", "tracing.guards", "tracing.stepcheck"},
    {"codegen.optimize", "codegen.coalesce"},
    {"codegen.lower"},
    {"execution.tuning_store"},
    {"execution.waits", "execution.interpret", "execution.feed", "execution.tuning"},
    {"execution.building"},
    {"execution.failures"},
    {"execution.results"},
    {"execution.runtime"},
    {"units.build"},
    {"units.unit"},
    {"units.cache"},
    {"ahead.runahead"},
    {"ahead.file_states", "ahead.loop_epochs"},
    {"ahead.stream_files"},
    {"ahead.streams"},
    {"ahead.coalescing"},
    {"ahead.speculator"},
    {"ahead.calls"},
    {"modes.loop"},
    {"modes.report"},
    {"modes.proxies"},
    {"modes.sites"},
    {"modes.regions"},
    {"modes.lazy"},
    {"modes.per_sample.conditions"},
    {"modes.per_sample.rewrite"},
    {"modes.per_sample.definition"},
    {"modes.per_sample.gather"},
    {"modes.per_sample.graph"},
    {"modes.per_sample.random_stream"},
    {"modes.per_sample.function"},
    {"modes.per_sample"},
    {"modes.stage"},
    {"generator_epochs"},
    {"api"},
    {"decorator"},
    {"explanation"},
    {"export"},
    {"__init__", "__main__", "launch"},
    {"nodes"},  # torchdata.nodes (an optional dependency): imported by no module
    {"ndd"},  # DALI's dynamic module with `compile`, typed (ndd.pyi): imported by no module
]
PACKAGES = {"core", "_dali", "tracing", "codegen", "execution", "units", "ahead", "modes"}


def _modules() -> dict[str, str]:
    """Dotted name within the package (`core.ir`, `_dali`, `api`) -> file."""
    found = {}
    for directory, _, files in os.walk(PACKAGE):
        folder = os.path.relpath(directory, PACKAGE).replace(os.sep, ".")
        if "__pycache__" in folder:
            continue
        for file in files:
            if not file.endswith(".py"):
                continue
            name = file[:-3]
            if folder == ".":
                found[name] = os.path.join(directory, file)
            elif name == "__init__":
                found[folder] = os.path.join(directory, file)
            else:
                found[f"{folder}.{name}"] = os.path.join(directory, file)
    return found


def _folder(module: str) -> str:
    head = module.split(".")[0]
    return head if head in PACKAGES else ""


def _layer(module: str) -> int:
    if module in PACKAGES and module != "_dali":  # a folder's __init__: its docstring alone
        return -1
    return next(i for i, layer in enumerate(LAYERS) if module in layer)


def _parse(path: str) -> ast.Module:
    with open(path) as file:
        return ast.parse(file.read())


def _package_of(module: str, path: str) -> list[str]:
    parts = module.split(".")
    return parts if path.endswith("__init__.py") and module != "__init__" else parts[:-1]


def _imports(module: str, path: str, modules: dict[str, str]) -> set[str]:
    """The package's modules that `module` imports (relative imports, resolved)."""
    found = set()
    for node in ast.walk(_parse(path)):
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        base = _package_of(module, path)
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join([*base, *(node.module.split(".") if node.module else [])])
        for alias in node.names:
            candidate = f"{target}.{alias.name}" if target else alias.name
            found.add(candidate if candidate in modules else target or "__init__")
    return found


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_imports_point_down():
    modules = _modules()
    for module, path in modules.items():
        for imported in _imports(module, path, modules):
            assert FOLDERS.index(_folder(imported)) <= FOLDERS.index(_folder(module)), (
                f"{module} imports {imported}: a folder above its own")
            assert _layer(imported) <= _layer(module), f"{module} imports {imported}"
            assert imported != module


def test_the_core_knows_nothing_of_dali():
    """core/ imports the standard library, astunparse, numpy, optree (structures; a DALI
    dependency) and itself: no DALI, no adapter."""
    import sys

    for module, path in _modules().items():
        if _folder(module) != "core":
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            for top in tops:
                assert top in sys.stdlib_module_names or top in (
                    "astunparse", "numpy", "optree"), (
                    f"{module} imports {top}")


def test_only_the_adapter_imports_dali():
    for module, path in _modules().items():
        if _folder(module) == "_dali":
            continue
        for node in ast.walk(_parse(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                else [])
            assert not any(n.startswith("nvidia") for n in names), f"{module} imports {names}"


def test_dali_is_reached_through_the_adapters_functions_only():
    """Outside the adapter, `_dali.<name>` names one of the adapter's own functions, types or
    constants (its `__all__`), never a DALI module handed through (f7fb7da: per_sample.py built
    its pipeline with `_dali.fn.external_source` and `_dali.types.DALIDataType`)."""
    import types

    from ndd_trace import _dali

    assert not [name for name in _dali.__all__
                if isinstance(getattr(_dali, name), types.ModuleType)]
    exported = set(_dali.__all__)
    for module, path in _modules().items():
        if _folder(module) == "_dali":
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id == "_dali":
                assert node.attr in exported, f"{module}:{node.lineno} uses _dali.{node.attr}"


def test_the_layout_is_what_the_readme_shows():
    with open(os.path.join(os.path.dirname(PACKAGE), "README.md")) as file:
        readme = file.read()
    for folder in PACKAGES:
        assert f"{folder}/" in readme, f"README.md's layout section does not show {folder}/"


# -- one of each (issue 32): each check below fails on f7fb7da's tree ---------------------------

def _definitions(name: str) -> list[str]:
    """The modules that define a function `name` at any level."""
    return sorted(module for module, path in _modules().items()
                  for node in ast.walk(_parse(path))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.name == name)


def test_one_key_encoding():
    """I5: one `freeze` (core/keys.py) for guard keys, op keys and region keys, and one printer
    of what it makes (f7fb7da: ir.freeze and guards.freeze; guards.show and report._thaw)."""
    assert _definitions("freeze") == ["core.keys"]
    assert _definitions("show") == ["core.keys"]
    assert _definitions("_thaw") == []
    assert _definitions("explain_miss") == ["core.keys"]


def _calls_of(name: str) -> list[str]:
    """The modules that call `name(...)` (a plain or attribute call)."""
    found = set()
    for module, path in _modules().items():
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else \
                    func.attr if isinstance(func, ast.Attribute) else None
                if called == name:
                    found.add(module)
    return sorted(found)


def test_one_way_from_a_graph_to_a_pipeline():
    """I1: an Executable is made in units/build.py only (f7fb7da: modes/stage.py,
    modes/regions.py and ahead/streams.py each made their own)."""
    assert _calls_of("Executable") == ["units.build"]


def _references(name: str) -> list[str]:
    """The modules that name `name` (as a name or an attribute), the defining one included."""
    found = set()
    for module, path in _modules().items():
        for node in ast.walk(_parse(path)):
            if (isinstance(node, ast.Name) and node.id == name) or \
                    (isinstance(node, ast.Attribute) and node.attr == name) or \
                    (isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name):
                found.add(module)
    return sorted(found)


def test_one_cache_of_units():
    """I2: guard keys are built, fast guards kept and misses explained in units/cache.py only;
    entries, regions, per-sample variants and reader streams are all held in a UnitCache
    (f7fb7da: modes/cache.py, per_sample.py and api.py built keys; report.py held the regions,
    per_sample.py its variants; process_state held the reader streams until the 25th session)."""
    for name in ("build_key", "FastGuard"):
        assert _references(name) == ["tracing.guards", "units.cache"], name
    assert _references("plan_for") == ["tracing.plans", "units.cache"]
    assert _references("explain_miss") == ["core.keys", "units.cache"]
    assert _references("LivePipelines") == ["units.cache"]
    holders = set()
    for module, path in _modules().items():
        with open(path) as file:
            if "UnitCache(" in file.read():
                holders.add(module)
    assert holders == {"api", "modes.per_sample.function", "units.cache"}, sorted(holders)
    # reader streams too: held as units of READER_STREAMS, in no registry of their own
    assert _references("READER_STREAMS") == ["ahead.streams", "units.cache"]
    with open(_modules()["core.process_state"]) as file:
        assert "\nstreams" not in file.read()  # (its reader -> stream registry, before)


def test_one_warning_sink():
    """I4: warnings go out through core/ledger.py only (f7fb7da: modes/stage.py,
    modes/per_sample.py and core/logs.py each called `warnings.warn`)."""
    assert _calls_of("warn_explicit") == ["core.ledger"]
    callers = {module for module, path in _modules().items() for node in ast.walk(_parse(path))
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "warn" and isinstance(node.func.value, ast.Name)
               and node.func.value.id == "warnings"}
    assert callers == {"core.ledger"}, sorted(callers)


def test_no_import_of_another_modules_private_name():
    """I6 (imports): a module uses another module's public names only; the adapter's package
    name `_dali` is the one exception (f7fb7da: `_state`, `_GraphBreak`, `_is_lazy`,
    `_LazyMixin`, `_MAX_SITES`, `_first_output`, `_is_concrete_data`, `_interceptor`)."""
    found = []
    for module, path in _modules().items():
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ImportFrom) and node.level:
                found += [f"{module}: {alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")
                          and alias.name != "_dali"]
    assert not found, found


def test_the_ir_is_declared():
    """I7: a graph node holds its declared fields only (f7fb7da: transparent mode set
    `node.results` and `node.proxies` on nodes, and wrote a feed hint, `static["no_copy"]`,
    into the op arguments that keys hash)."""
    import pytest

    from ndd_trace.core.ir import Node, NodeKind

    node = Node(index=0, kind=NodeKind.OP, name="flip")
    assert not hasattr(node, "__dict__")
    with pytest.raises(AttributeError):
        node.results = []
    for module, path in _modules().items():
        with open(path) as file:
            source = file.read()
        assert 'static["no_copy"]' not in source, f"{module} writes a feed hint into arguments"


def test_one_verdict_type():
    """I3: why a unit or a call does not run as compiled is a `core.ledger.Verdict`, set where it
    is decided, and calls not run as compiled are counted by the ledger alone (f7fb7da:
    `eager_reason` set in 9 places, `fallbacks += 1` by hand in 8, path strings compared as
    text)."""
    assigned = []
    for module, path in _modules().items():
        for node in ast.walk(_parse(path)):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in (
                        "eager_reason", "eager_loc", "fallbacks"):
                    assigned.append(f"{module}: .{target.attr}")
    assert all(item.startswith("core.ledger:") for item in assigned), assigned
    from ndd_trace.core.ledger import Runs

    words = {runs.value for runs in Runs} | {"storm"}
    compared = [f"{module}: {node.lineno}" for module, path in _modules().items()
                for node in ast.walk(_parse(path)) if isinstance(node, ast.Compare)
                for side in [node.left, *node.comparators]
                if isinstance(side, ast.Constant) and side.value in words]
    assert not compared, f"how a unit runs compared as text: {compared}"


def test_cache_counters_are_counted_by_the_cache():
    """I2/I3: a unit cache's hits, misses and traces are counted by units/cache.py alone, as
    each lookup finds its unit (the parent of this check, 4b73f6c: the region runner and the
    per-sample function counted them by hand, beside UnitCache.lookup)."""
    counted = []
    for module, path in _modules().items():
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute) and \
                    node.target.attr in ("hits", "misses", "traces") and \
                    isinstance(node.target.value, ast.Attribute) and \
                    node.target.value.attr == "counters":
                counted.append(f"{module}:{node.lineno}")
    assert all(item.startswith("units.cache:") for item in counted), counted


def _private_names_defined(path: str) -> set[str]:
    """The `_names` a module defines: functions, classes, and attributes it assigns on self."""
    names = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {name for name in names if name.startswith("_")}


def test_the_public_entry_points_use_public_surfaces():
    """I6 (attributes): explain, export, the launcher, the CLI and the torchdata nodes read
    compiled functions and the runtime through their public methods, not `x._private`
    (f7fb7da: explain read `compiled._entry_cache`, `compiled._stage.take_failure()`; export
    called `compiled._loop()`, `_normalize`, `_options()`)."""
    modules = _modules()
    for module in ("api", "explanation", "export", "launch", "__main__", "nodes"):
        own = _private_names_defined(modules[module])
        for node in ast.walk(_parse(modules[module])):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                    not node.attr.startswith("__") and node.attr not in own and \
                    not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls",
                                                                                "_dali")):
                raise AssertionError(f"{module}:{node.lineno}: {ast.unparse(node)}")


MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300


# Constructors of containers and synchronization state: a module-level value made by one of these
# (or by a dict/list/set display or comprehension) is state the process keeps between calls.
_MUTABLE = {"dict", "list", "set", "OrderedDict", "Counter", "defaultdict", "deque", "WeakSet",
            "WeakKeyDictionary", "WeakValueDictionary", "local", "Lock", "RLock", "Condition",
            "Event", "Semaphore"}
# Its homes: the process's state, the unit cache (units and live pipelines), the adapter.
_STATE_HOMES = {"core.process_state", "units.cache"}


def test_mutable_state_has_three_homes():
    """I8: module-level mutable values (containers, locks, thread-locals) and `global`
    statements appear only in core/process_state.py, units/cache.py and the adapter (_dali/);
    constant tables are frozensets or read-only mappings (f7fb7da: about 20 in 10 modules)."""
    found = []
    for module, path in _modules().items():
        if module in _STATE_HOMES or module.split(".")[0] == "_dali":
            continue
        tree = _parse(path)
        found += [f"{module}:{node.lineno} global" for node in ast.walk(tree)
                  if isinstance(node, ast.Global)]
        for node in tree.body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if [ast.unparse(target) for target in targets] == ["__all__"]:
                continue
            value = node.value
            call = value.func if isinstance(value, ast.Call) else None
            name = call.id if isinstance(call, ast.Name) else \
                call.attr if isinstance(call, ast.Attribute) else None
            if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                                  ast.SetComp)) or name in _MUTABLE:
                found.append(f"{module}:{node.lineno} {ast.unparse(targets[0])}")
    assert not found, found


def test_module_budget():
    """I9: no module of ndd_trace is over 500 lines: a larger one is split by responsibility
    (f7fb7da: per_sample.py 1,094 lines, api.py 661, trace.py 627, tuning.py 613, stepcheck.py
    557, guards.py 550, runtime.py 508)."""
    over = {}
    for module, path in _modules().items():
        with open(path) as file:
            lines = sum(1 for _ in file)
        if lines > MAX_MODULE_LINES:
            over[module] = lines
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_class_budget():
    """I9: no class of ndd_trace is over 300 lines (f7fb7da: CompiledFunction, ReaderStream,
    Tuner and Executable were; each gave a part of its own to a module: core/spelling.py,
    ahead/stream_files.py, tuning.coordinate_descent, execution/building.py)."""
    over = {f"{module}.{node.name}": node.end_lineno - node.lineno + 1
            for module, path in _modules().items() for node in ast.walk(_parse(path))
            if isinstance(node, ast.ClassDef)
            and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES}
    assert not over, f"classes over {MAX_CLASS_LINES} lines: {over}"


# -- tests organised by behaviour, each behaviour with one home (issue 32) -----------------------

# Words that name where tests came from (a review, a fuzzer's findings, a list of bugs, the
# mismatches a corpus found, reduced) rather than what they check.
PROVENANCE = ("regression", "fuzz_cases", "known_difference", "review", "found", "bug", "reduced",
              "issue", "session", "misc")

# A test file named by a mode: its name, the harness's mode (tests/harness.py MODES).
MODE_FILES = {
    "compile": "compiled",  # a compiled function: decorator, options, cache, graph breaks
    "loops": "loop",  # compiled generators over readers
    "transparent": "transparent",  # transparent mode: its values, scripts, eval modes
}

# A test file named by a behaviour no module is named after: its name, the page (or file) that
# documents the behaviour, and the behaviour, in a line.
BEHAVIOURS = {
    "architecture": ("README.md", "the layers point down and each concept has one home"),
    "argument_split": ("docs/tracing.md", "numbers and lists for tensor arguments, as eager"),
    "bench_ddp": ("benchmarks/bench_ddp.py", "the DDP benchmark's shards and its launcher"),
    "cli": ("docs/launching.md", "`python -m ndd_trace`: help, version, logs' channels"),
    "conformance": ("docs/transparent.md", "DALI's documented dynamic mode, unchanged"),
    "dali_surface": ("README.md", "every private DALI name the adapter uses, with its reason"),
    "docs": ("docs/index.md", "every page's code runs, the site builds"),
    "ecosystem": ("docs/launching.md", "launchers, NDD_TRACE=1, per-rank reports, logging"),
    "examples": ("examples/preprocess.py", "the examples run as documented"),
    "faults": ("docs/guide.md", "a corrupt file fails its step; the loop goes on as eager's"),
    "fuzz": ("benchmarks/fuzz.py", "random ndd programs: the fuzzer finds nothing"),
    "lightning": ("docs/pytorch.md", "Lightning over a compiled loop, resumed mid-epoch"),
    "loop_fuzz": ("benchmarks/fuzz_loops.py", "random loops, consumers: the fuzzer finds nothing"),
    "names": ("docs/debugging.md", "any name in user code gives generated code that runs"),
    "ops": ("docs/limitations.md", "every operator of the namespace, eager's bits compiled"),
    "portable_paths": ("docs/export.md", "generated code names files as the project does"),
    "reliability": ("docs/limitations.md", "bad inputs, threads, memory, exit, trusted files"),
    "repros": ("docs/limitations.md", "../shared/repros' scripts print SAME"),
    "setup": ("README.md", "the set-up commands and .ci/run agree"),
    "training_loops": ("docs/guide.md", "a corpus of training loops, every mode as eager"),
    "transparent_replay": ("docs/transparent.md", "call-site replay, step by step as eager"),
    "typing": ("docs/typing.md", "mypy and pyright see a compiled function's types"),
    "warm_start": ("docs/warm-start.md", "NDD_TRACE_CACHE_DIR: later processes start warm"),
}


def _test_file_names() -> list[str]:
    """The names of tests/test_<name>.py."""
    folder = os.path.dirname(os.path.abspath(__file__))
    return sorted(name[len("test_"):-len(".py")] for name in os.listdir(folder)
                  if name.startswith("test_") and name.endswith(".py"))


def test_no_test_file_is_named_by_where_its_tests_came_from():
    """A file named by provenance (test_regressions: "found in review"; test_fuzz_cases: "found
    by the fuzzer"; test_known_differences) gathers tests of unrelated behaviours, and so each of
    them gets a second home beside its own file (f7fb7da: guards tested in test_guards,
    test_compile and test_regressions; float64 constants three times in test_regressions). A
    test lives in the file of the behaviour it checks; its story goes in its docstring ("found
    by the fuzzer: ..."). The fuzzers' own files (test_fuzz, test_loop_fuzz: "the fuzzer finds
    nothing") and test_repros (../shared/repros run as tests) are behaviours, and pass."""
    named = [name for name in _test_file_names() if any(word in name for word in PROVENANCE)]
    assert not named, f"test files named by provenance: {named}"
    tests = [f"{name}: {node.name}" for name in _test_file_names()
             for node in _parse(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             f"test_{name}.py")).body
             if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
             and node.name[len("test_"):].startswith(PROVENANCE)]
    assert not tests, f"tests named by provenance: {tests}"


def test_each_test_file_names_a_module_a_mode_or_a_documented_behaviour():
    """tests/test_<name>.py is named after a module or folder of ndd_trace (test_guards:
    tracing/guards.py, test_units: units/), a mode (MODE_FILES, one of the harness's), or a
    behaviour listed in BEHAVIOURS with the page that documents it: where a test goes follows
    from what it checks. Every entry of the lists names a file that exists."""
    import harness

    root = os.path.dirname(PACKAGE)
    package = {part for module in _modules() for part in module.split(".")} - {"__init__"}
    unnamed = [name for name in _test_file_names()
               if name not in package and name not in MODE_FILES and name not in BEHAVIOURS]
    assert not unnamed, (f"test files named by no module, mode or listed behaviour: {unnamed} "
                         "(move their tests to the file of what they check, or list the "
                         "behaviour in BEHAVIOURS with its page)")
    assert set(MODE_FILES.values()) <= set(harness.MODES)
    stale = sorted((set(MODE_FILES) | set(BEHAVIOURS)) - set(_test_file_names()))
    assert not stale, f"listed, but no tests/test_<name>.py: {stale}"
    undocumented = [name for name, (page, _) in BEHAVIOURS.items()
                    if not os.path.exists(os.path.join(root, page))]
    assert not undocumented, f"behaviours whose page is missing: {undocumented}"
    assert not set(BEHAVIOURS) & package and not set(MODE_FILES) & package


# -- one differential harness (I10) --------------------------------------------------------------

TESTS = os.path.dirname(os.path.abspath(__file__))

# The harness's own names: its comparator and what it reads values and the generator with.
HARNESS_NAMES = {"assert_same", "first_difference", "observe", "to_numpy", "rng_state",
                 "assert_runs_match", "assert_matches_eager", "run"}

# Functions that seed the default generator and run code through ndd_trace on purpose.
SEEDED_RUNS = {
    "loopshapes.py:_drive": "the consumer's plan reseeds between and inside epochs (the loop "
                            "shapes under test); each run is seeded and compared by harness.run",
}

# Functions that read the default generator's state on purpose, each with its reason.
RNG_STATE_READERS = {
    "loopshapes.py:_drive": "the consumer's plan saves the state to restore it later (user "
                            "code: `rng.state = saved`), compared by the harness's run",
}


def _test_modules() -> dict[str, ast.Module]:
    """tests/*.py (not tests/scripts/: the user programs the script tests run), harness.py
    apart."""
    return {name: _parse(os.path.join(TESTS, name)) for name in sorted(os.listdir(TESTS))
            if name.endswith(".py") and name != "harness.py"}


def _own_nodes(function: ast.AST):
    """The nodes of a function's own body: a function nested in it (a scenario: the user code
    a test runs, which may reseed as users do) is not walked, only its decorators."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(getattr(node, "decorator_list", []))
            continue
        stack.extend(ast.iter_child_nodes(node))


def _called(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else \
        func.id if isinstance(func, ast.Name) else None


def _runs_through_ndd_trace(node: ast.AST) -> bool:
    """`ndd.compile(...)`, `ndd_trace.compile(...)`, `ndd_trace.enabled()`, `.enable()`, or
    `@ndd.compile`."""
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and (
        target.value.id in ("ndd", "ndd_trace") and target.attr == "compile"
        or target.value.id == "ndd_trace" and target.attr in ("enabled", "enable"))


def test_one_differential_harness():
    """I10: tests/harness.py alone seeds, runs eagerly and through ndd_trace, and compares:
    outside it no function both seeds the default generator in its own body and runs code
    through ndd_trace (compiled, transparent), none reads the default generator's state but
    the listed ones, and no module defines a harness name (its comparator `assert_same`, `observe`,
    `rng_state`, ...) (f7fb7da: conftest's run_both, assert_same and to_numpy, and about 10
    harnesses and 8 comparators of their own: test_loops' assert_loops_match,
    test_training_loops' assert_same_observations, the fuzzers' checks, ...)."""
    seeded_runs, readers, defined = [], [], []
    for name, tree in _test_modules().items():
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            where = f"{name}:{function.name}"
            if function in tree.body and function.name in HARNESS_NAMES:
                defined.append(where)
            own = list(_own_nodes(function))
            if where not in SEEDED_RUNS and any(_called(node) == "set_seed" for node in own) and \
                    any(_runs_through_ndd_trace(node) for node in ast.walk(function)):
                seeded_runs.append(where)
            if where not in RNG_STATE_READERS and any(
                    isinstance(node, ast.Attribute) and node.attr == "state"
                    and isinstance(node.ctx, ast.Load) and _called(node.value) == "get_default_rng"
                    for node in own):
                readers.append(where)
    assert not seeded_runs, f"seeded eager-vs-ndd_trace runs outside tests/harness.py: " \
                            f"{seeded_runs}"
    assert not readers, f"the generator's state read outside tests/harness.py: {readers}"
    assert not defined, f"the harness's names defined outside tests/harness.py: {defined}"


# -- state kept in its homes, class bodies and counters included (issue 32, item 6) -------------

# Constructors of numbers the process keeps counting between calls (itertools.count).
_COUNTERS = {"count"}


def _state_made(value: ast.expr) -> str | None:
    """What kind of state `value` makes, or None: a mutable container (a display, a
    comprehension or a constructor of `_MUTABLE`: locks and thread-locals too) or a counter."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return "container"
    name = _called(value)
    return "container" if name in _MUTABLE else "counter" if name in _COUNTERS else None


def _self_stores(function: ast.AST) -> list[ast.AST]:
    """The values a method stores in an attribute of `self` (`self.x = v`, `self.x += v`)."""
    stores = []
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                    target.value.id == "self":
                stores.append(node if isinstance(node, ast.AugAssign) else node.value)
    return stores


def _stateful_classes(modules: dict[str, str]) -> set[str]:
    """ndd_trace's classes whose instances change after they are made: a method other than
    `__init__` stores in `self`, `__init__` stores a container, lock, thread-local or counter,
    a dataclass not frozen has fields, or a base is such a class, a container or a
    thread-local (`class _Scope(threading.local)`)."""
    classes = {node.name: node for path in modules.values() for node in ast.walk(_parse(path))
               if isinstance(node, ast.ClassDef)}
    stateful = set()
    for name, node in classes.items():
        frozen = any(isinstance(d, ast.Call) and any(k.arg == "frozen" and
                                                     getattr(k.value, "value", False)
                                                     for k in d.keywords)
                     for d in node.decorator_list)
        dataclass = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stores = _self_stores(item)
                if item.name != "__init__" and stores or any(
                        value is not None and not isinstance(value, ast.AugAssign)
                        and _state_made(value) for value in stores):
                    stateful.add(name)
            elif dataclass and not frozen and isinstance(item, ast.AnnAssign):
                stateful.add(name)
    bases = {name: {ast.unparse(base).split(".")[-1] for base in node.bases}
             for name, node in classes.items()}
    grown = True
    while grown:
        grown = False
        for name in set(classes) - stateful:
            if bases[name] & (stateful | _MUTABLE):
                stateful.add(name)
                grown = True
    return stateful


def test_no_class_level_or_instance_state_outside_its_homes():
    """I8, extended: outside core/process_state.py, units/cache.py and the adapter, no class
    body keeps a mutable container, lock, thread-local or counter (a class attribute is module
    state by another name), and no module keeps a counter (itertools.count) or an instance of
    one of ndd_trace's classes that changes (a thread-local subclass, a registry) (3a38351:
    errors.py's `GraphBreakSignal.raised = threading.local()`, per_sample/conditions.py's
    `scope = _Scope()`, lower.py's and per_sample/rewrite.py's `_counter = itertools.count()`).
    Instances that do not change (a key policy, a frozen value) are constants, and pass."""
    modules = _modules()
    stateful = _stateful_classes(modules)
    found = []
    for module, path in modules.items():
        if module in _STATE_HOMES or module.split(".")[0] == "_dali":
            continue
        tree = _parse(path)
        bodies = [(None, tree.body)] + [(node.name, node.body) for node in ast.walk(tree)
                                        if isinstance(node, ast.ClassDef)]
        for owner, body in bodies:
            for node in body:
                if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if [ast.unparse(target) for target in targets] in (["__all__"], ["__slots__"]):
                    continue
                kind = _state_made(node.value) or (
                    "an instance that changes" if _called(node.value) in stateful else None)
                if kind is None or owner is None and kind == "container":
                    continue  # (module-level containers: test_mutable_state_has_three_homes)
                where = f"{owner}." if owner else ""
                found.append(f"{module}:{node.lineno} {where}{ast.unparse(targets[0])}: {kind}")
    assert not found, found


# -- the README's layout names every module, after a glossary (issue 32, item 7) ----------------

# The concept names the code uses, each defined once by the glossary that opens the layout.
GLOSSARY = ("graph", "key", "guard", "program", "executable", "unit", "unit cache", "entry",
            "region", "variant", "stream", "run", "verdict", "ledger")


def _readme_layout() -> str:
    """README.md's layout section: from `## Layout` to the next section."""
    with open(os.path.join(os.path.dirname(PACKAGE), "README.md")) as file:
        readme = file.read()
    layout = readme[readme.index("\n## Layout\n"):]
    end = layout.find("\n## ", 1)
    return layout if end < 0 else layout[:end]


def test_the_readme_layout_names_every_module_after_a_glossary():
    """The layout section opens with a glossary, a table defining each of GLOSSARY once, and
    then names every module of ndd_trace in its folder's row (`spelling.py`, or `base` in the
    adapter's; a package by its folder, `per_sample/`) (3a38351: core/spelling.py and
    execution/building.py were in no row; the glossary had no run and no verdict)."""
    layout = _readme_layout()
    glossary = layout[:layout.index("| folder | owns |")]
    defined = [line.split("|")[1].strip() for line in glossary.splitlines()
               if line.startswith("| ") and not line.startswith("| word ")]
    assert sorted(defined) == sorted(GLOSSARY), \
        f"the glossary defines {defined}, not each of {GLOSSARY} once"
    rows = {line.split("`")[1]: line for line in layout.splitlines()
            if line.startswith("| `ndd_trace/")}
    unnamed = []
    for module, path in sorted(_modules().items()):
        folder = _folder(module)
        row = rows.get(f"ndd_trace/{folder}/" if folder else "ndd_trace/", "")
        name = os.path.basename(path)[:-3]
        if name == "__init__" and module != "__init__":
            name = f"{module.split('.')[-1]}/"
            found = f"`{name}`" in row or module == folder  # a folder: the row itself
        else:
            found = f"`{name}.py`" in row or f"`{name}`" in row
        if not found:
            unnamed.append(f"{module} ({os.path.relpath(path, os.path.dirname(PACKAGE))})")
    assert not unnamed, f"modules the README's layout section does not name: {unnamed}"


# -- eager against ndd_trace through the harness only (issue 32, item 7) -------------------------

# numpy's comparators: values alone (no dtype, layout, device or structure), sample by sample.
_NUMPY_COMPARATORS = {"assert_array_equal", "assert_equal", "array_equal", "assert_allclose",
                      "allclose"}

# Tests that run code through ndd_trace and compare values with numpy's, each with its reason.
HAND_COMPARISONS = {
    "test_codegen.py:test_the_code_runs_standalone": "the lowered source run by DALI alone, "
    "outside ndd_trace: a raw pipeline's outputs against eager's",
    "test_export.py:test_random_ops_draw_their_own_numbers_deterministically": "an exported "
    "module's random values differ from eager's (its own seed): np.array_equal under `not all`",
    "test_optimize.py:test_fused_random_crop_is_deterministic_and_draws_eager_windows": "crop "
    "windows read back from the images: eager's within a tolerance (their rounding)",
    "test_transparent.py:test_lazy_tensor_fields": "lazy values read by ndd itself against "
    "numpy's arithmetic, not against an eager run",
    "test_guards.py:test_self_and_closure_objects_are_keyed_by_the_attributes_read": "numpy's "
    "generator state before and after a key is built (a property not run), not values",
}


def test_eager_and_ndd_trace_are_compared_by_the_harness():
    """I10, extended: a test that runs code through ndd_trace (compiled, per-sample,
    transparent) compares its values with the harness (`assert_matches_eager`, `assert_same`:
    dtype, layout, device, structure and every bit), not with numpy's comparators sample by
    sample, unless listed in HAND_COMPARISONS with its reason (3a38351: test_faults'
    test_corrupt_file_in_compiled_function and test_per_sample's namedtuple test compared eager
    and compiled by hand)."""
    found = []
    for name, tree in _test_modules().items():
        for function in tree.body:
            if not isinstance(function, ast.FunctionDef) or f"{name}:{function.name}" in \
                    HAND_COMPARISONS:
                continue
            nodes = list(ast.walk(function))
            if any(_runs_through_ndd_trace(node) for node in nodes) and \
                    any(_called(node) in _NUMPY_COMPARATORS for node in nodes):
                found.append(f"{name}:{function.name}")
    assert not found, f"eager and ndd_trace compared by hand, outside tests/harness.py: {found}"


def _loops_over_modes(node: ast.AST) -> bool:
    """`for mode in ("eager", "compiled")` (or a comprehension over such a literal): a test
    running each mode by hand, the harness's job."""
    iterated = node.iter if isinstance(node, (ast.For, ast.comprehension)) else None
    return isinstance(iterated, (ast.Tuple, ast.List)) and any(
        isinstance(item, ast.Constant) and item.value == "eager" for item in iterated.elts)


def test_modes_are_run_by_the_harness():
    """A test does not loop over modes itself (`for mode in ("eager", "compiled",
    "transparent")`, each run set up and compared by hand): the harness's modes run them
    (the twenty-third session's review found four, the pattern the rule above misses)."""
    found = [f"{name}:{function.name}" for name, tree in _test_modules().items()
             for function in ast.walk(tree) if isinstance(function, ast.FunctionDef)
             and any(_loops_over_modes(node) for node in ast.walk(function))]
    assert not found, f"modes looped over by hand, outside tests/harness.py: {found}"


def _verdict_text(node: ast.AST) -> bool:
    """`x.eager_reason`, or the `.reason` of a verdict (`verdict.reason`, `entry.verdict.reason`,
    `ledger.verdicts[-1].reason`): a verdict's text."""
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr == "eager_reason":
        return True
    owner = node.value.value if isinstance(node.value, ast.Subscript) else node.value
    name = owner.attr if isinstance(owner, ast.Attribute) else \
        owner.id if isinstance(owner, ast.Name) else ""
    return node.attr == "reason" and "verdict" in name


def test_verdicts_are_made_in_the_ledger_and_read_by_kind():
    """Issue 32: a verdict (compiled, eager for this variant, eager for this call, graph break)
    is made only by its kind's constructor in core/ledger.py, which decides its kind and text
    together, and no module tells a verdict's kind from its text (the parent of this check:
    `Verdict(...)` built in 16 places across 6 modules, a graph break only a "graph break: "
    prefix on its reason, built again as text by explain)."""
    kind_words = ("compiled", "eager for this", "graph break")  # (core.ledger.VerdictKind's)
    made, read_as_text = [], []
    for module, path in _modules().items():
        for node in ast.walk(_parse(path)):
            if module != "core.ledger" and _called(node) == "Verdict":
                made.append(f"{module}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("startswith", "endswith") and (
                    _verdict_text(node.func.value) or any(
                        isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                        and arg.value.startswith(kind_words) for arg in node.args)):
                read_as_text.append(f"{module}:{node.lineno}")
            if isinstance(node, ast.Compare) and any(
                    isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and (
                    any(_verdict_text(side) for side in node.comparators) or (
                        isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)
                        and node.left.value.startswith(kind_words))):
                read_as_text.append(f"{module}:{node.lineno}")
    assert not made, f"Verdict(...) made outside core/ledger.py: {made}"
    assert not read_as_text, f"a verdict's kind read from its text: {read_as_text}"


# `x._name` a module may use though it defines no `_name`: public APIs spelled with an underscore
FOREIGN_PRIVATES_ALLOWED = {
    "_replace": "a NamedTuple's copy with changes (TensorMeta._replace), public despite the `_`",
    "sys._getframe": "CPython's documented way to the caller's frame (the user's line)",
}


def _names_a_module_defines(tree: ast.Module) -> set[str]:
    """The `_names` a module defines: its functions and classes, class attributes, and the
    attributes its methods assign on `self` (or `cls`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):  # (assigned in its body, not in its methods)
            names.update(target.id for statement in node.body if not isinstance(
                statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                for target in ast.walk(statement)
                if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
    return {name for name in names if name.startswith("_")}


def test_no_module_reaches_into_another_modules_objects():
    """I6 (objects): a module reads, calls or writes `obj._name` only on `self`, `cls` or
    `super()`, or where it defines `_name` itself; another module's objects are used through
    their public names. The adapter (`_dali/`), which exists to reach into DALI's objects, is
    exempt (3a38351: transparent mode's call sites called `tracer._ref_of`, `_rng_slot`,
    `_proxy`, ...; the reader streams took `executable._lock`; the speculator compared
    `run._executable`; a compiled generator set `self._step._stage.runs`; the tracer read
    `value._tracer`, `_ref`, `_meta` of values.py's traced values)."""
    found = []
    for module, path in _modules().items():
        if module == "_dali" or module.startswith("_dali."):
            continue
        tree = _parse(path)
        own = _names_a_module_defines(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or \
                    node.attr.startswith("__") or node.attr in own:
                continue
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls") or \
                    isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and \
                    receiver.func.id == "super":
                continue
            spelled = ast.unparse(node)
            if node.attr in FOREIGN_PRIVATES_ALLOWED or spelled in FOREIGN_PRIVATES_ALLOWED:
                continue
            found.append(f"{module}:{node.lineno}: {spelled}")
    assert not found, f"another module's private names used on its objects: {sorted(found)}"


def _is_key(node: ast.AST) -> bool:
    """`key`, `region_key`, `region.key`: an expression that names a key of ours."""
    name = node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else ""
    return name == "key" or name.endswith("_key")


def test_keys_printed_and_read_in_core_keys_only():
    """I5 (printer): keys are printed, and taken apart by position, in core/keys.py only;
    elsewhere a key's parts are read by their labels and fields (`keys.parts_of`, `OpPart.op`)
    and its printed lines are not parsed back (f7fb7da: report._describe_key decoded a region
    key by position, Region.op_chain and input_kinds parsed its lines with startswith and
    slices; 3a38351: units/cache.py logged `key[:1]`). The adapter's own key of DALI's op
    instances (`_dali`) is DALI's layout, not ours."""
    found = []
    for module, path in _modules().items():
        if module == "core.keys" or module.startswith("_dali"):
            continue
        for node in ast.walk(_parse(path)):
            where = f"{module}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Subscript) and _is_key(node.value) and \
                    isinstance(node.slice, (ast.Constant, ast.Slice, ast.UnaryOp)):
                found.append(f"{where}: a key read by position")
            if isinstance(node, (ast.For, ast.comprehension)) and (
                    _is_key(node.iter) or isinstance(node.iter, ast.Subscript)
                    and _is_key(node.iter.value)):
                found.append(f"{where}: a key's items walked")
            loops = [node] if isinstance(node, ast.For) else node.generators if isinstance(
                node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) else []
            for loop in loops:  # a printed line (`.parts`) is read whole, never sliced or matched
                if not (isinstance(loop.iter, ast.Attribute) and loop.iter.attr == "parts"
                        and isinstance(loop.target, ast.Name)):
                    continue
                for use in ast.walk(node):
                    parsed = isinstance(use, ast.Subscript) or isinstance(use, ast.Attribute) \
                        and use.attr in ("startswith", "endswith", "split", "partition")
                    if parsed and isinstance(use.value, ast.Name) and \
                            use.value.id == loop.target.id:
                        found.append(f"{where}: a key's printed line parsed")
    assert not found, found
    assert _references("show_arguments") in ([], ["core.keys"])  # (the op part's printer)
    assert not [name for name in ("_describe_key", "_thaw") if _definitions(name)]


def test_runs_names_how_calls_run_only():
    """I6 (one name per concept): `runs` is how a unit's calls run (`Runs`, `verdict.runs`);
    a count of runs is `run_count` (3a38351: Region.runs and the per-sample function's runs
    were counts)."""
    found = []
    for module, path in _modules().items():
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute) and \
                    node.target.attr == "runs":
                found.append(f"{module}:{node.lineno}: `.runs` counted")
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    node.target.id == "runs" and ast.unparse(node.annotation) == "int":
                found.append(f"{module}:{node.lineno}: `runs: int`")
    assert not found, found
