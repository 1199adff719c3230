"""The README's set-up is two commands a CPU user can paste on a fresh machine, in the right
order, and `.ci/run` runs the same ones (read here, not run: nothing is installed)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import tomllib

from conftest import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts)) as file:
        return file.read()


def _commands(text: str) -> list[str]:
    """The shell commands of a script or block: continuation lines joined, comments and blank
    lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
        if line:
            commands.append(line)
    return commands


def _steps(command: str) -> list[list[str]]:
    """A command's `&&`-chained steps, each as its words."""
    return [shlex.split(step) for step in command.split("&&")]


def _setup_commands() -> list[str]:
    readme = _read("README.md")
    section = readme[readme.index("## Set-up"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [command for block in blocks for command in _commands(block)]


def _is_pip_install(words: list[str]) -> bool:
    return words[:4] == ["python", "-m", "pip", "install"]


def test_readme_setup_is_two_commands_cpu_torch_first():
    install, test = _setup_commands()  # exactly two
    torch_step, package_step, example_step = _steps(install)
    # 1. PyTorch's CPU build, from PyTorch's CPU index, before anything needs torch
    assert _is_pip_install(torch_step) and "torch" in torch_step[4:]
    assert torch_step[torch_step.index("--index-url") + 1] == CPU_INDEX
    # 2. the package with its test extra, editable (the tests import the checkout)
    assert _is_pip_install(package_step) and package_step[4:] == ["-e", ".[test]"]
    # 3. the main example, on its default device
    assert example_step == ["python", "examples/preprocess.py"]
    assert _words(test) == ["python", "-m", "pytest", "-q", "-n", "2", "tests"]


def _words(command: str) -> list[str]:
    (words,) = _steps(command)
    return words


def test_the_example_runs_on_the_cpu_by_default():
    tree = ast.parse(_read("examples", "preprocess.py"))
    defaults = {
        call.args[0].value: keyword.value.value
        for call in ast.walk(tree) if isinstance(call, ast.Call)
        and getattr(call.func, "attr", None) == "add_argument" and call.args
        for keyword in call.keywords if keyword.arg == "default"}
    assert defaults["--device"] == "cpu"


def test_the_test_extra_needs_torch_so_cpu_torch_goes_first():
    """The order matters: the test extra requires torch (directly and through torchdata and
    pytorch-lightning), which pip would otherwise take from its default index (CUDA)."""
    extras = tomllib.loads(_read("pyproject.toml"))["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[ ]", requirement)[0] for requirement in extras["test"]}
    assert {"torch", "torchdata", "pytorch-lightning", "pytest"} <= names
    assert extras["torchdata"] == ["torchdata>=0.10"]


def test_ci_runs_the_readme_commands_in_the_same_order():
    ci = _commands(_read(".ci", "run"))
    install, test = _setup_commands()
    _, package_step, example_step = _steps(install)

    def position(words: list[str]) -> int:
        found = [i for i, line in enumerate(ci)
                 if [w for w in shlex.split(line) if w != "-q"][:len(words)] ==
                 [w for w in words if w != "-q"]]
        assert found, (words, ci)
        return found[0]

    torch_pin = next(i for i, line in enumerate(ci)
                     if _is_pip_install(shlex.split(line)) and any(
                         w.startswith("torch==") for w in shlex.split(line)))
    package = position(package_step)
    example = position(example_step)
    tests = position(_words(test))
    assert torch_pin < package < example < tests


# -- a plain install (no extras) runs the main example ----------------------------------------

def test_the_main_example_runs_without_the_extras():
    """`pip install ndd_trace` brings DALI, numpy, astunparse and optree only: the example runs
    with torch, pillow and scikit-learn unimportable (what a plain install lacks), on its own
    made-up images (examples/_images.py)."""
    import subprocess
    import sys

    from conftest import subprocess_env

    blocked = ["torch", "PIL", "sklearn", "benchmarks", "matplotlib", "torchdata"]
    code = (f"import runpy, sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
            "sys.argv = ['examples/preprocess.py', '--epochs', '1', '--images', '12']\n"
            "sys.path.insert(0, 'examples')\n"
            "runpy.run_path('examples/preprocess.py', run_name='__main__')\n")
    completed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                               text=True, timeout=300, env=subprocess_env())
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "compiled == eager, bit for bit" in completed.stdout
    assert "+ numpy," in completed.stdout  # (no torch: the batches went to numpy)


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_main_examples_imports_come_with_a_plain_install():
    """Every module examples/preprocess.py and its helper import unconditionally is the
    standard library's, ndd_trace's, the helper's, or a distribution a plain install brings:
    a core dependency or one of DALI's own (nvImageCodec encodes the example's images)."""
    import importlib.metadata
    import sys

    core = {_requirement_name(r) for r in
            tomllib.loads(_read("pyproject.toml"))["project"]["dependencies"]}
    brought = set(core)
    for name in core:
        for requirement in importlib.metadata.requires(name) or []:
            if "extra ==" not in requirement:
                brought.add(_requirement_name(requirement))
    distributions = importlib.metadata.packages_distributions()
    for file in ("preprocess.py", "_images.py"):
        tree = ast.parse(_read("examples", file))
        guarded = {id(node) for handler in ast.walk(tree) if isinstance(handler, ast.Try)
                   for node in ast.walk(handler) if any(
                       isinstance(h.type, ast.Name) and h.type.id == "ImportError"
                       for h in handler.handlers)}
        for node in ast.walk(tree):
            if id(node) in guarded or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""])
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("ndd_trace", "_images", "__future__"):
                    continue
                if top == "nvidia":  # a namespace of several distributions: the module's own
                    top = name
                found = {d.lower().replace("_", "-") for d in distributions.get(top, []) or
                         distributions.get(name.split(".")[0], [])}
                if top.startswith("nvidia."):
                    found = {_distribution_of(name)}
                assert found & brought, f"examples/{file} imports {name} ({found}): not in a " \
                                        f"plain install ({sorted(brought)})"


def _distribution_of(module: str) -> str:
    """The distribution that installed `module`'s files (for namespace packages)."""
    import importlib.metadata
    import importlib.util

    origin = os.path.realpath(importlib.util.find_spec(module).origin)
    for distribution in importlib.metadata.distributions():
        for file in distribution.files or []:
            if os.path.realpath(str(distribution.locate_file(file))) == origin:
                return distribution.metadata["Name"].lower().replace("_", "-")
    raise AssertionError(f"no distribution installed {module}")


# -- the package's metadata --------------------------------------------------------------------

def test_license_metadata_is_an_spdx_expression_with_its_text():
    project = tomllib.loads(_read("pyproject.toml"))
    assert project["project"]["license"] == "Apache-2.0"  # PEP 639, not the deprecated table
    assert project["project"]["license-files"] == ["LICENSE"]
    text = _read("LICENSE")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # with an SPDX expression, a license classifier is an error (and would say it twice)
    assert not [c for c in project["project"]["classifiers"] if c.startswith("License ::")]
    assert "Typing :: Typed" in project["project"]["classifiers"]


def test_the_version_is_written_once():
    project = tomllib.loads(_read("pyproject.toml"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "ndd_trace.__version__"}
    import ndd_trace

    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", ndd_trace.__version__)
    assert _read("pyproject.toml").count(ndd_trace.__version__) == 0


def test_the_sdist_ships_no_tests_without_what_they_read():
    """The tests read the checkout (docs, examples, benchmarks, .ci): the sdist ships none."""
    assert "prune tests" in _commands(_read("MANIFEST.in"))


def test_the_build_warns_of_nothing_deprecated(tmp_path):
    """The sdist and the wheel build from a copy of the project's files without setuptools'
    deprecation warnings (`project.license` as a table was one: an error from 2027-02-18), the
    sdist with every file of the package and without tests, the wheel with the license and the
    stub."""
    import shutil
    import subprocess
    import sys
    import tarfile
    import zipfile

    probe = "import setuptools, wheel; assert int(setuptools.__version__.split('.')[0]) >= 77"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode:
        import pytest

        pytest.skip("needs setuptools>=77 and wheel here (the build system's; no isolation)")
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", "benchmarks",
        "docs", "examples"))
    code = ("import setuptools.build_meta as b, sys\n"
            "out = sys.argv[1]  # (a build rewrites sys.argv)\n"
            "print('SDIST', b.build_sdist(out))\n"
            "print('WHEEL', b.build_wheel(out))\n")
    completed = subprocess.run([sys.executable, "-W", "always", "-c", code, str(tmp_path)],
                               cwd=source, capture_output=True, text=True, timeout=300)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    assert "deprecat" not in output.lower(), output[-3000:]
    sdist = re.search(r"SDIST (\S+)", output).group(1)
    wheel = re.search(r"WHEEL (\S+)", output).group(1)
    with tarfile.open(tmp_path / sdist) as archive:
        names = archive.getnames()
    assert not [name for name in names if "/tests/" in name]
    assert any(name.endswith("/LICENSE") for name in names)
    # what the package runs with, every file of it, and the NDD_TRACE=1 hook: a wheel built
    # from the sdist (as pip builds one) lacks nothing
    shipped = {name.split("/", 1)[1] for name in names if "/" in name}
    needed = {os.path.relpath(os.path.join(folder, file), ROOT)
              for folder, _, files in os.walk(os.path.join(ROOT, "ndd_trace"))
              for file in files if not file.endswith(".pyc")}
    needed |= {"_ndd_trace_hook.py", "ndd_trace.pth", "setup.py", "pyproject.toml", "README.md"}
    assert not needed - shipped, f"the sdist lacks {sorted(needed - shipped)}"
    with zipfile.ZipFile(tmp_path / wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert "ndd_trace/ndd.pyi" in names and "ndd_trace/py.typed" in names
    assert "ndd_trace.pth" in names
    assert any(name.endswith("licenses/LICENSE") for name in names)
    assert b"License-Expression: Apache-2.0" in metadata
