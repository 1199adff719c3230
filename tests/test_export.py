"""Export round trips: the exported module and the serialized pipeline, each run in a fresh
process that cannot import ndd_trace, give the compiled function's outputs."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from conftest import ROOT, subprocess_env
from harness import assert_same, seeded, to_numpy

import ndd_trace


def _clean_path() -> list[str]:
    """This interpreter's sys.path without any entry that holds ndd_trace."""
    return [p for p in sys.path if p and not os.path.isdir(os.path.join(p, "ndd_trace"))]


def run_clean(code: str, cwd: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (-I -S: no site, no PYTHONPATH, no .pth hooks) whose
    sys.path has DALI and numpy but no ndd_trace; fails the test if it raises."""
    prelude = textwrap.dedent(f"""
        import importlib.util, sys
        sys.path[:0] = {json.dumps(_clean_path())}
        assert importlib.util.find_spec("ndd_trace") is None, "ndd_trace is importable"
    """)
    completed = subprocess.run([sys.executable, "-I", "-S", "-c", prelude + code], cwd=cwd,
                               capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


def run_module(path: str, cwd: str, *args: str) -> subprocess.CompletedProcess:
    return run_clean(f"import runpy; sys.argv = {[path, *args]!r}; "
                     f"runpy.run_path({path!r}, run_name='__main__')", cwd)


def _saved(path: str, count: int) -> list[list[np.ndarray]]:
    data = np.load(path)
    return [[data[f"out{k}__{i}"] for i in range(len([key for key in data.files
                                                        if key.startswith(f"out{k}__")]))]
            for k in range(count)]


def preprocess(images, weights):
    small = ndd.resize(images, size=[8, 8])
    flipped = ndd.flip(small, horizontal=1)
    scaled = ndd.cast(flipped, dtype=ndd.float32) * 0.5 + 1
    return ndd.cast(scaled, dtype=ndd.uint8), ndd.math.sqrt(scaled) * weights


@pytest.fixture
def weights():
    return ndd.batch([np.float32([i + 1, 2, 3]) for i in range(4)])


def test_python_module_round_trip(batch, weights, tmp_path):
    compiled = ndd.compile(preprocess)
    expected = to_numpy(list(compiled(batch, weights)))
    exported = ndd_trace.export(compiled, batch, weights, path=str(tmp_path / "pre.py"))
    assert exported.inputs == ["images", "weights"] and exported.batch_size == 4
    text = (tmp_path / "pre.py").read_text()
    assert "ndd_trace" not in text.split('"""', 2)[2]  # only the docstring names it
    assert "@pipeline_def(batch_size=4" in text and "test_export.py:" in text
    assert "scaled = " in text and " * 0.5" in text
    completed = run_module("pre.py", str(tmp_path), "--save", "out.npz")
    assert "output 0: 4 samples of uint8" in completed.stdout
    assert_same(expected, _saved(str(tmp_path / "out.npz"), 2))


def test_serialized_round_trip(batch, weights, tmp_path):
    compiled = ndd.compile(preprocess)
    expected = to_numpy(list(compiled(batch, weights)))
    ndd_trace.export(compiled, batch, weights, path=str(tmp_path / "pre.dali"),
                     format="serialized")
    np.savez(tmp_path / "in.npz", **{f"images__{i}": np.asarray(s) for i, s in enumerate(batch)},
             **{f"weights__{i}": np.asarray(s) for i, s in enumerate(weights)})
    run_clean(textwrap.dedent("""
        import numpy as np
        from nvidia.dali import Pipeline
        pipe = Pipeline.deserialize(filename="pre.dali")
        pipe.build()
        data = np.load("in.npz")
        for name in ("images", "weights"):
            pipe.feed_input(name, [data[f"{name}__{i}"] for i in range(4)])
        saved = {f"out{k}__{i}": np.array(out[i]) for k, out in enumerate(pipe.run())
                 for i in range(len(out))}
        np.savez("out.npz", **saved)
    """), str(tmp_path))
    assert_same(expected, _saved(str(tmp_path / "out.npz"), 2))


def noisy(x):
    noise = ndd.random.uniform(batch_size=x.batch_size, range=[0, 1], shape=[3])
    return x * 2, x + noise


def test_random_ops_draw_their_own_numbers_deterministically(tmp_path):
    x = ndd.batch([np.float32([1, 2, 3])] * 3)
    with seeded(9):
        expected = to_numpy(list(ndd.compile(noisy)(x)))
    ndd_trace.export(noisy, x, path=str(tmp_path / "noisy.py"), seed=42)
    assert "_state" not in (tmp_path / "noisy.py").read_text()
    run_module("noisy.py", str(tmp_path), "--save", "a.npz")
    run_module("noisy.py", str(tmp_path), "--save", "b.npz")
    first, second = _saved(str(tmp_path / "a.npz"), 2), _saved(str(tmp_path / "b.npz"), 2)
    assert_same(first, second)  # one seed, one stream: runs repeat
    assert_same(expected[:1], first[:1])  # deterministic outputs are eager's
    assert not all(np.array_equal(a, b) for a, b in zip(expected[1], first[1]))


def test_random_states_as_inputs_give_eager_values(tmp_path):
    x = ndd.batch([np.float32([1, 2, 3])] * 3)
    with seeded(9):
        eager = to_numpy(list(noisy(x)))
    exported = ndd_trace.export(noisy, x, path=str(tmp_path / "noisy.dali"),
                                format="serialized", random="inputs")
    assert exported.inputs == ["x", "noise_state"]
    rng = ndd.random.RNG(seed=9)
    state = np.array([rng() for _ in range(7)], dtype=np.uint32)  # what the op draws
    np.save(tmp_path / "state.npy", state)
    run_clean(textwrap.dedent("""
        import numpy as np
        from nvidia.dali import Pipeline
        pipe = Pipeline.deserialize(filename="noisy.dali")
        pipe.build()
        pipe.feed_input("x", [np.float32([1, 2, 3])] * 3)
        pipe.feed_input("noise_state", [np.load("state.npy")] * 3)
        out = pipe.run()[1]
        np.save("noise.npy", np.stack([np.array(out[i]) for i in range(3)]))
    """), str(tmp_path))
    np.testing.assert_array_equal(np.stack(eager[1]), np.load(tmp_path / "noise.npy"))


def test_compiled_generator_exports_its_reader(jpeg_dir, tmp_path):
    @ndd.compile
    def batches(reader):
        for jpegs, labels in reader.next_epoch(batch_size=2):
            yield ndd.resize(ndd.decoders.image(jpegs), size=[8, 8]), labels

    first = next(iter(batches(ndd.readers.File(file_root=str(jpeg_dir)))))
    expected = to_numpy(list(first))
    exported = ndd_trace.export(batches, ndd.readers.File(file_root=str(jpeg_dir)),
                                path=str(tmp_path / "loader.py"))
    assert exported.inputs == [] and exported.batch_size == 2
    assert "fn.readers.file(" in (tmp_path / "loader.py").read_text()
    run_module("loader.py", str(tmp_path), "--save", "out.npz")
    assert_same(expected, _saved(str(tmp_path / "out.npz"), 2))


def test_graph_break_cannot_be_exported(batch, tmp_path):
    def branching(x):
        if x.shape[0] > 1:  # BREAK-LINE
            return x
        return ndd.flip(x)

    with pytest.raises(ndd_trace.ExportError) as info:
        ndd_trace.export(branching, batch, path=str(tmp_path / "b.py"))
    line = branching.__code__.co_firstlineno + 1
    assert f"test_export.py:{line}" in str(info.value) and ".shape" in str(info.value)
    assert not (tmp_path / "b.py").exists()


def test_python_callback_source_cannot_be_exported(jpeg_dir, tmp_path):
    source = ndd.ExternalSource(lambda: [np.zeros(3, np.float32)] * 2)

    @ndd.compile
    def pulled():
        for values in source.captured(batch_size=2):
            yield values * 2

    with pytest.raises(ndd_trace.ExportError, match="ExternalSource") as info:
        ndd_trace.export(pulled, path=str(tmp_path / "p.py"))
    assert "test_export.py:" in str(info.value)


def test_command_line(batch, tmp_path):
    (tmp_path / "usermod.py").write_text(textwrap.dedent("""
        import nvidia.dali.experimental.dynamic as ndd

        def brighten(images):
            return ndd.flip(images, vertical=1) * 2
    """))
    np.savez(tmp_path / "in.npz", **{f"images__{i}": np.asarray(s) for i, s in enumerate(batch)})
    completed = subprocess.run(
        [sys.executable, "-m", "ndd_trace", "export", "usermod:brighten", "--example", "in.npz",
         "--out", "bright.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=subprocess_env(), check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "wrote bright.py" in completed.stdout
    run_module("bright.py", str(tmp_path), "--save", "out.npz")
    expected = to_numpy(ndd.flip(batch, vertical=1) * 2)
    assert_same([expected], _saved(str(tmp_path / "out.npz"), 1))
    assert ROOT  # the child found this checkout through PYTHONPATH


def _shrink_big(image):
    if image.shape[0] > 45:
        return ndd.resize(image, size=[8, 8])
    return ndd.resize(ndd.flip(image, horizontal=1), size=[8, 8])


def test_per_sample_function_round_trips(batch, tmp_path):
    """Its pipeline is the shared graph lowered: serialized, or a standalone module, its
    branches spelled as DALI's conditional splits and merges; with random ops, serialized
    only."""
    shrink_big = ndd.compile(_shrink_big, per_sample=True)
    expected = to_numpy([shrink_big(batch)])
    exported = ndd_trace.export(shrink_big, batch, path=str(tmp_path / "shrink.dali"),
                                format="serialized")
    assert exported.inputs == ["image"]
    np.savez(tmp_path / "in.npz", **{f"image__{i}": np.asarray(s) for i, s in enumerate(batch)})
    run_clean(textwrap.dedent("""
        import numpy as np
        from nvidia.dali import Pipeline
        pipe = Pipeline.deserialize(filename="shrink.dali")
        pipe.build()
        data = np.load("in.npz")
        pipe.feed_input("image", [data[f"image__{i}"] for i in range(4)])
        (out,) = pipe.run()
        np.savez("out.npz", **{f"out0__{i}": np.array(out[i]) for i in range(len(out))})
    """), str(tmp_path))
    assert_same(expected, _saved(str(tmp_path / "out.npz"), 1))
    exported = ndd_trace.export(shrink_big, batch, path=str(tmp_path / "shrink.py"))
    assert "fn._conditional.split(" in exported.source and exported.inputs == ["image"]
    run_module("shrink.py", str(tmp_path), "--save", "module_out.npz")
    assert_same(expected, _saved(str(tmp_path / "module_out.npz"), 1))

    @ndd.compile(per_sample=True)
    def maybe_flip(image):
        if ndd.random.coin_flip().item():
            return ndd.flip(image, horizontal=1)
        return image

    with pytest.raises(ndd_trace.ExportError, match="serialized"):
        ndd_trace.export(maybe_flip, batch, path=str(tmp_path / "flip.py"), random="inputs")


@pytest.mark.gpu
def test_gpu_pipeline_round_trip(batch, tmp_path):
    def on_gpu(images):
        return ndd.resize(images.gpu(), size=[8, 8]) * 0.5

    expected = to_numpy([ndd.compile(on_gpu)(batch)])
    exported = ndd_trace.export(on_gpu, batch, path=str(tmp_path / "gpu.py"))
    assert exported.device_id is not None
    run_module("gpu.py", str(tmp_path), "--save", "out.npz")
    assert_same(expected, _saved(str(tmp_path / "out.npz"), 1))


_MODULE = ["Expr", "Import", "Import", "ImportFrom", "FunctionDef", "Assign", "Assign",
           "FunctionDef", "If"]  # docstring, imports, the pipeline, INPUTS, EXAMPLE, main


def _flipped(x):
    return ndd.flip(x, horizontal=1)


def test_export_of_a_lambda(batch, tmp_path):
    """A lambda's name is no identifier: its pipeline function gets one."""
    function = lambda x: ndd.flip(x, horizontal=1) * 2
    expected = to_numpy([ndd.compile(function)(batch)])
    ndd_trace.export(function, batch, path=str(tmp_path / "lam.py"))
    text = (tmp_path / "lam.py").read_text()
    assert "def _lambda__pipeline():" in text
    run_module("lam.py", str(tmp_path), "--save", "out.npz")
    assert_same(expected, _saved(str(tmp_path / "out.npz"), 1))


def test_output_file_name_stays_in_the_docstring(batch, tmp_path):
    """Quotes, backslashes and line breaks of the file name are escaped in the docstring."""
    name = '_p""";open("injected.txt","w").write("ran");"""\\\n.py'
    expected = to_numpy([ndd.compile(_flipped)(batch)])
    ndd_trace.export(_flipped, batch, path=str(tmp_path / name))
    tree = ast.parse((tmp_path / name).read_text())
    assert [type(statement).__name__ for statement in tree.body] == _MODULE
    assert "    python '_p\"\"\";open(" in ast.get_docstring(tree)
    run_module(name, str(tmp_path), "--save", "out.npz")
    assert not (tmp_path / "injected.txt").exists()
    assert_same(expected, _saved(str(tmp_path / "out.npz"), 1))


def test_source_file_name_stays_in_its_comment(batch, tmp_path):
    """A line break in the user's file name does not end the `# file:line` comment."""
    marker = tmp_path / "injected.txt"
    filename = f"user.py\n    open({str(marker)!r}, 'w').write('ran')\n#"
    namespace = {"ndd": ndd}
    code = compile("def f(x):\n    return ndd.flip(x, horizontal=1)\n", filename, "exec")
    exec(code, namespace)  # noqa: S102 (the test's own code)
    expected = to_numpy([ndd.compile(namespace["f"])(batch)])
    ndd_trace.export(namespace["f"], batch, path=str(tmp_path / "f.py"))
    tree = ast.parse((tmp_path / "f.py").read_text())
    assert [type(statement).__name__ for statement in tree.body] == _MODULE
    # (its source unreadable, eager ndd passes `horizontal=1` as a tensor argument: a constant)
    assert [type(s).__name__ for s in tree.body[4].body] == ["Assign"] * 3 + ["Return"]
    run_module("f.py", str(tmp_path), "--save", "out.npz")
    assert not marker.exists()
    assert_same(expected, _saved(str(tmp_path / "out.npz"), 1))


def test_float64_constant_round_trip(batch, tmp_path):
    """A float64 numpy constant (numpy's default dtype) is written as a float constant and a cast:
    DALI's Constant holds no doubles."""
    mean = np.array([100.0, 110.0, 120.0])

    def centred(images):
        return ndd.crop_mirror_normalize(images, mean=mean, std=[2.0, 2.0, 2.0]), \
            ndd.cast(images, dtype=ndd.float64) - np.array([1.5, 2.5, 3.5])

    compiled = ndd.compile(centred)
    expected = to_numpy(list(compiled(batch)))
    ndd_trace.export(compiled, batch, path=str(tmp_path / "centred.py"))
    assert "dtype=types.FLOAT64" in (tmp_path / "centred.py").read_text()
    run_module("centred.py", str(tmp_path), "--save", "out.npz")
    assert_same(expected, _saved(str(tmp_path / "out.npz"), 2))
