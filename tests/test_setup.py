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
    assert _words(test) == ["python", "-m", "pytest", "-q", "tests"]


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
