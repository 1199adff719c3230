"""Names and paths in generated code: any dict key, variable, function or file name gives code
that compiles, reads the right values and runs nothing but the pipeline."""

from __future__ import annotations

import ast
import keyword
import linecache
import os
import unicodedata
import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import assert_compiles_exactly
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ndd_trace  # noqa: F401 (ndd.compile)
from ndd_trace import launch
from ndd_trace.core.source import NameTable, docstring, one_line

A = ndd.as_batch([np.full((2, 2), 10, np.int32)])
B = ndd.as_batch([np.full((2, 2), 100, np.int32)])


def _statements(source: str) -> list[str]:
    """The kinds of the generated module's statements and of its pipeline function's body."""
    tree = ast.parse(source)
    function = tree.body[-1]
    return [type(s).__name__ for s in tree.body] + [type(s).__name__ for s in function.body]


def _assert_only_the_pipeline(lowered) -> None:
    """The code holds imports, the function, one assignment per node and the return; all its
    names are ASCII."""
    expected = ["Import", "ImportFrom", "FunctionDef", *["Assign"] * len(lowered.names),
                "Return"]
    assert _statements(lowered.source) == expected, lowered.source
    assert len(lowered.source.splitlines()) == 5 + len(lowered.names) + 2
    names = {n.id for n in ast.walk(ast.parse(lowered.source)) if isinstance(n, ast.Name)}
    assert all(name.isascii() and name.isidentifier() for name in names)


def nfkc_key(d):
    d_y = d["ｙ"] * 2  # "ｙ" (fullwidth) reads as `y` in an identifier: `d_ｙ` is `d_y`
    return d_y + d["ｙ"]


def fraction_key(d):
    return d["a½"] + 1  # '½'.isalnum(), yet no identifier holds it


def folded_keys(d):
    return d["ｘ"] - d["x"]  # two keys, one identifier after NFKC


def superscript_kwargs(**kw):
    return kw["n²"] * 3


def test_nfkc_key_does_not_read_a_user_variable():
    compiled = assert_compiles_exactly(nfkc_key, {"ｙ": A})
    lowered = compiled.entries[0].lowered
    assert "_k0_d_y = fn.external_source(name='_k0_d_y'" in lowered.source
    assert "d_y = _k0_d_y * 2" in lowered.source
    _assert_only_the_pipeline(lowered)


@pytest.mark.parametrize("function, args, kwargs", [
    (fraction_key, ({"a½": A},), {}),
    (folded_keys, ({"ｘ": A, "x": B},), {}),
    (superscript_kwargs, (), {"n²": A}),
], ids=["fraction", "folded", "kwargs"])
def test_keys_that_are_no_identifiers(function, args, kwargs):
    compiled = assert_compiles_exactly(function, *args, **kwargs)
    _assert_only_the_pipeline(compiled.entries[0].lowered)


def _from_source(source: str, filename: str, namespace: dict) -> dict:
    """Define functions from `source` under `filename`, its lines visible to linecache (as a
    real file's are, so that the generated code takes its variable names)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 (the test's own code)
    return namespace


def test_file_name_with_a_line_break_stays_in_its_comment(tmp_path):
    marker = tmp_path / "injected.txt"
    filename = f"user.py\n    open({str(marker)!r}, 'w').write('ran')\n#"
    namespace = _from_source("def flipped(x):\n    return ndd.flip(x, horizontal=1)\n",
                             filename, {"ndd": ndd})
    x = ndd.as_batch([np.arange(6, dtype=np.uint8).reshape(1, 6, 1)], layout="HWC")
    compiled = assert_compiles_exactly(namespace["flipped"], x)
    lowered = compiled.entries[0].lowered
    assert not marker.exists()
    assert "  # user.py\\n    open(" in lowered.source
    _assert_only_the_pipeline(lowered)


def test_lambda_and_odd_function_names_name_a_valid_pipeline():
    odd = lambda x: x + 1
    odd.__name__ = 'f"""\n½'
    compiled = assert_compiles_exactly(odd, A)
    lowered = compiled.entries[0].lowered
    assert lowered.function_name.isascii() and lowered.function_name.isidentifier()
    _assert_only_the_pipeline(lowered)


# -- properties over random names --------------------------------------------------------------

_COLLIDING = ["ｙ", "y", "x", "ｘ", "a½", "n²", "", "0", "fn", "consts", "float", "_k0_", "_k0_d_y",
              "\n", '"""', "d_y", "图像", "größe", "\ud800"]
keys = st.one_of(st.sampled_from(_COLLIDING), st.text(max_size=5))


def _plain(name: str) -> bool:
    normal = unicodedata.normalize("NFKC", name)
    return name.isidentifier() and not keyword.iskeyword(normal) and \
        normal not in {"d", "total", "KEYS", "ndd"}


variables = st.one_of(st.sampled_from(["d_y", "d_x", "ｄ_ｙ", "fn", "consts", "float",
                                       "_k0_d_y", "d_", "größe", "add", "mul"]),
                      st.from_regex(r"[^\W\d]\w{0,4}", fullmatch=True)).filter(_plain)
file_names = st.text(max_size=12).filter(lambda name: "\0" not in name and
                                          not name.startswith("<"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(keys, min_size=1, max_size=3, unique=True),
       st.lists(variables, min_size=1, max_size=3), file_names)
def test_any_keys_variables_and_file_names(key_list, variable_list, filename):
    """Random dict keys, user variables named like the keys' spellings and a random file
    name: compiled == eager, and the code is only the pipeline."""
    lines = ["def f(d):", "    total = d[KEYS[0]] * 1"]
    for index, variable in enumerate(variable_list):
        lines += [f"    {variable} = d[KEYS[{index % len(key_list)}]] * {index + 2}",
                  f"    total = total + {variable}"]
    namespace = _from_source("\n".join([*lines, "    return total", ""]), filename,
                             {"KEYS": key_list})
    data = {key: ndd.as_batch([np.full((2,), i + 1, np.int32)]) for i, key in
            enumerate(key_list)}
    compiled = assert_compiles_exactly(namespace["f"], data)
    _assert_only_the_pipeline(compiled.entries[0].lowered)


@given(st.lists(st.text(max_size=6), max_size=12))
def test_name_table_gives_distinct_ascii_identifiers(names):
    table = NameTable(frozenset({"fn", "types"}))
    given_names = [table.claim(name) for name in names]
    assert all(n.isascii() and n.isidentifier() and not keyword.iskeyword(n)
               for n in given_names)
    assert len({unicodedata.normalize("NFKC", n) for n in given_names}) == len(names)
    assert not {"fn", "types"} & set(given_names)


def test_name_table_keeps_plain_names():
    table = NameTable(frozenset({"fn"}))
    assert [table.claim(n) for n in ["images", "images", "fn", "<lambda>", "1x", "if", "d_ｙ"]] \
        == ["images", "images_2", "fn_", "_lambda_", "v1x", "if_", "_k0_d_y"]


@given(st.text(max_size=30))
def test_comment_and_docstring_texts_end_where_they_should(text):
    comment = "x = 1  # " + one_line(text)
    assert len(ast.parse(comment).body) == 1 and len(comment.splitlines()) == 1
    literal = docstring(text)
    tree = ast.parse(literal)
    assert len(tree.body) == 1 and ast.literal_eval(literal) == text


# -- the per-rank report -----------------------------------------------------------------------

@pytest.mark.parametrize("rank", ["/../../escaped", "..", "3/../../x", "a\nb", "٣"])
def test_report_stays_in_its_folder(monkeypatch, tmp_path, rank):
    monkeypatch.setenv("RANK", rank)
    folder = tmp_path / "reports"
    for template in ("report.json", "report-{rank}.json"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            written = launch.write_report(str(folder / template))
        assert os.path.dirname(written) == str(folder)
        assert os.listdir(tmp_path) == ["reports"]
    assert all(name.isascii() and "/" not in name for name in os.listdir(folder))


def test_plain_ranks_name_reports_as_before(monkeypatch):
    monkeypatch.setenv("RANK", "12")
    assert launch.report_path("out/r.json") == "out/r.rank12.json"
