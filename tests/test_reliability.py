"""Bad inputs, threads, memory and shutdown: correct results or clear errors, nothing lost."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import warnings
import weakref

import numpy as np
import pytest
from conftest import ROOT, subprocess_env
from harness import (Fresh, Step, assert_compiles_exactly, assert_matches_eager,
                     assert_runs_match, assert_same, observe, run, to_numpy)

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace


def test_wrong_dtype_for_op_raises_eager_error_with_user_line(images):
    floats = ndd.as_batch([i.astype(np.float64) for i in images], layout="HWC")

    @ndd.compile
    def hue(x):
        return ndd.hsv(x, hue=10.0)  # hsv takes no float64

    with pytest.raises(Exception) as info:
        to_numpy(hue(floats))
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "test_reliability.py" in notes or "test_reliability.py" in str(info.value)
    # still usable, compiled and eagerly
    data = ndd.as_batch(images, layout="HWC")
    assert_same(ndd.hsv(data, hue=10.0), hue(data))


def test_wrong_ndim_reports_and_keeps_working(images):
    flat = ndd.as_batch([np.ascontiguousarray(i.reshape(-1)) for i in images])

    @ndd.compile
    def rotated(x):
        return ndd.rotate(x, angle=10.0)

    with pytest.raises(Exception):
        to_numpy(rotated(flat))
    data = ndd.as_batch(images, layout="HWC")
    assert_same(ndd.rotate(data, angle=10.0), rotated(data))


def test_empty_batch_runs_eagerly():
    empty = ndd.as_batch([], dtype=ndd.uint8)

    @ndd.compile
    def plus_one(x):
        return x + 1

    # (eager ndd itself reports batch_size 1 for the result of an empty batch: `batch_size or 1`)
    with pytest.warns(ndd_trace.NddTraceWarning, match="empty batch"):
        assert plus_one(empty).batch_size == plus_one.__wrapped__(empty).batch_size
    assert plus_one.cache_info().fallbacks == 1


def _child(code: str, *arguments: str) -> subprocess.CompletedProcess:
    script = f"import sys\nsys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script, *arguments], capture_output=True,
                          text=True, timeout=120, env=subprocess_env())


def test_empty_samples_into_gaussian_blur_and_laplacian_run_eagerly_without_crashing():
    """gaussian_blur and laplacian given samples with no elements: the calls run eagerly (empty
    samples, as eager returns them), warned and reported at the user's line, and the process
    lives (found by an independent differential fuzzer, ../shared/repros/fuzz/07: SIGSEGV)."""
    completed = _child("""
        import warnings
        import numpy as np
        import nvidia.dali.experimental.dynamic as ndd
        import ndd_trace

        def blur(x):
            return ndd.gaussian_blur(x, window_size=3)

        def edges(x):  # (empty samples an op made have a null data pointer: eager crashes too)
            return ndd.flip(ndd.laplacian(x, window_size=3), horizontal=1)

        def results(fn, xs, transparent=False):
            out = []
            for x in xs:
                if transparent:
                    ndd_trace.enable()
                y = fn(x)
                out.append([(s.shape, s.tobytes()) for s in (np.asarray(t) for t in y)])
                ndd_trace.disable()
            return out

        for function, layout, shapes in [(blur, "HW", [(3, 3), (1, 0), (3, 3)]),
                                         (edges, "HWC", [(4, 4, 3), (1, 0, 3), (4, 4, 3)])]:
            xs = [ndd.as_batch([np.full(shape, 9, np.uint8)] * 7, layout=layout)
                  for shape in shapes]
            eager = results(function, xs)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                compiled = ndd.compile(function)
                assert results(compiled, xs) == eager
            assert any("no elements" in str(w.message) for w in caught), caught
            assert compiled.cache_info().traces == 1
            assert results(function, xs, transparent=True) == eager
        eager_calls = ndd_trace.report().eager_ops
        assert any("no elements" in reason and where.startswith("<string>:")
                   for (_, reason, where) in eager_calls), eager_calls
        print("SAME")
    """)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "SAME" in completed.stdout


def test_numpy_torch_none_and_unhashable_static_arguments(batch):
    torch = pytest.importorskip("torch")

    def scaled(x, weights, table, nothing, options):
        y = ndd.cast(x, dtype=ndd.float32) * ndd.as_tensor(weights)
        y = y + float(table[0]) + options["offset"]
        return y if nothing is None else nothing

    weights = np.array([1.0, 0.5, 0.25], dtype=np.float32)
    readonly = weights.copy()
    readonly.flags.writeable = False
    for w in (weights, readonly):
        assert_compiles_exactly(scaled, batch, w, torch.tensor([2.0]), None,
                                {"offset": [1]} and {"offset": 1})


def test_non_contiguous_input_fails_like_eager(images):
    strided = [np.asarray(i)[:, ::2] for i in images]

    def make():
        return ndd.as_batch(strided, layout="HWC")

    with pytest.raises(Exception) as eager:
        make()
    assert "Strided" in str(eager.value) or "stride" in str(eager.value).lower()


def test_user_buffers_are_read_at_the_call():
    """Eager ndd reads its inputs when called: a caller that refills its numpy buffers right
    after a call (or mutates an array an ndd.Tensor aliases) before consuming the results gets
    the values the buffers held at the call, from a compiled step called in its loop and in
    transparent mode (found in review: compiled, it once gave a silently wrong result)."""
    def scenario(buffers, double):
        results = []
        for step in range(3):
            for buffer in buffers:
                buffer[...] = step + 1
            results.append(double(ndd.as_batch(buffers, layout="HWC")))
            results.append(ndd.math.abs(buffers[0]) * 2)
            for buffer in buffers:
                buffer[...] = 5  # the caller reuses its buffers right after the call
        view = ndd.as_tensor(buffers[0])
        results.append(view + 1)
        buffers[0][...] = 9
        return results

    runs = assert_matches_eager(
        scenario, Fresh(lambda: [np.full((16, 16, 3), 1, np.float32) for _ in range(4)]),
        Step(lambda t: t * 2), modes=("step", "transparent"))
    doubled = runs["eager"].result[0::2][:3]
    assert [float(value.samples[3].ravel()[-1]) for value in doubled] == [2.0, 4.0, 6.0]


def test_threads_get_their_own_default_generators(batch):
    def noisy(x):
        return ndd.cast(x, dtype=ndd.float32) + ndd.random.uniform(batch_size=x.batch_size)

    compiled = ndd.compile(noisy)
    calls = 20
    expected = {}
    for seed in range(4):
        expected[seed] = run(noisy, batch, seed=seed, calls=calls).results
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            ndd.random.set_seed(seed)
            results[seed] = [observe(compiled(batch)) for _ in range(calls)]
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and all(not t.is_alive() for t in threads)
    assert_same([expected[seed] for seed in range(4)], [results[seed] for seed in range(4)])
    assert compiled.cache_info().traces == 1


def test_memory_stays_flat_over_many_cache_hits(batch):
    @ndd.compile
    def flip(x):
        return ndd.flip(x) * 2

    for _ in range(50):
        to_numpy(flip(batch))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(1000):
        flip(batch).evaluate()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert growth < 512 * 1024, f"Python memory grew by {growth} bytes over 1000 calls"


def test_collected_compiled_function_releases_its_pipeline(batch):
    compiled = ndd.compile(lambda x: ndd.flip(x))
    compiled(batch).evaluate()
    pipeline = weakref.ref(compiled.entries[0].executable.pipeline)
    del compiled
    gc.collect()
    assert pipeline() is None


def test_cache_clear_releases_pipelines(batch):
    compiled = ndd.compile(lambda x: ndd.flip(x))
    compiled(batch).evaluate()
    pipeline = weakref.ref(compiled.entries[0].executable.pipeline)
    compiled.cache_clear()
    gc.collect()
    assert pipeline() is None and compiled.cache_info().entries == 0


def test_process_with_running_compiled_loop_exits_promptly(jpeg_dir):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        import nvidia.dali.experimental.dynamic as ndd
        import ndd_trace

        @ndd.compile
        def loop(reader):
            for jpegs, labels in reader.next_epoch(batch_size=2):
                yield ndd.decoders.image(jpegs), labels

        reader = ndd.readers.File(file_root={str(jpeg_dir)!r})
        epoch = loop(reader)
        next(epoch)
        print("consumed one batch", flush=True)
    """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               timeout=120, env=subprocess_env())
    assert completed.returncode == 0, completed.stderr
    assert "consumed one batch" in completed.stdout


@pytest.mark.parametrize("mode", ["compiled", "transparent"])
def test_process_exits_after_pipeline_runs_fail_part_way_through_a_batch(mode):
    """Runs that fail part-way through a batch (a per-channel `mean` on a 1-channel sample):
    eager's errors at eager's calls, and the process exits (found by an independent
    differential fuzzer, ../shared/repros/fuzz/13: it never exited, DALI's executor hung)."""
    completed = _child("""
        import warnings
        import numpy as np
        import nvidia.dali.experimental.dynamic as ndd
        import ndd_trace
        from ndd_trace.execution import runtime

        warnings.simplefilter("ignore")
        MEAN = [1.0, 2.0, 3.0]
        runtime.REBUILD_WAIT = 0  # rebuilt after one eager call: 3 failed pipelines sooner

        def f(x):
            return ndd.crop_mirror_normalize(x, mean=MEAN, std=[2.0])

        def outcomes(fn, transparent):
            g = np.random.default_rng(0)
            seen = []
            for _ in range(12):
                x = ndd.as_batch([g.normal(size=(int(g.integers(1, 4)), int(g.integers(0, 4)),
                                                  int(g.integers(0, 3)))).astype(np.float32)
                                  for _ in range(6)], layout="CHW")
                if transparent:
                    ndd_trace.enable()
                try:
                    out = fn(x)
                    out.evaluate()
                    seen.append([np.asarray(t).tobytes() for t in out])
                except RuntimeError as error:
                    seen.append(type(error).__name__)
                finally:
                    ndd_trace.disable()
            return seen

        eager = outcomes(f, False)
        compiled = ndd.compile(f)
        mine = outcomes(compiled if sys.argv[1] == "compiled" else f, sys.argv[1] != "compiled")
        assert mine == eager, (mine, eager)
        assert eager.count("RuntimeError") >= 4, eager
        if sys.argv[1] == "compiled":
            assert "failed 3 times" in compiled.entries[0].eager_reason
            # explain says what the held entry recorded at its run, not what a new trace says
            x = ndd.as_batch([np.ones((3, 2, 2), np.float32)] * 6, layout="CHW")
            assert f"not compiled whole ({compiled.entries[0].eager_reason})" in \
                str(ndd_trace.explain(compiled, x))
        print("END OF SCRIPT", flush=True)
    """, mode)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "END OF SCRIPT" in completed.stdout


def test_exception_during_trace_leaves_no_tracing_state(batch):
    def broken(x):
        ndd.flip(x)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        ndd.compile(broken)(batch)
    # ndd calls outside any compiled function run eagerly again, with concrete results
    result = ndd.flip(batch)
    assert not isinstance(result, ndd_trace.tracing.trace.TracedBatch)
    assert to_numpy(result)[0].shape == to_numpy(batch)[0].shape


def _flipped(images):
    return ndd.flip(images, horizontal=1)


def _flipped_forty_times(images):  # a later version of the function: a longer module
    for k in range(40):
        images = ndd.flip(images, horizontal=k % 2)
    return images


def test_a_failed_export_keeps_the_previous_one_whole(tmp_path):
    """The disk fills (here: a file-size limit, as a full disk fails a write) while an export
    writes over an earlier one: the earlier module and its example inputs stay as they were."""
    resource = pytest.importorskip("resource")
    import signal

    frames = ndd.as_batch([np.zeros((6, 5, 3), np.uint8)] * 3, layout="HWC")
    path = tmp_path / "pipe.py"
    ndd_trace.export(_flipped, frames, path=str(path))
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    assert set(before) == {"pipe.py", "pipe_example.npz"}
    # room for the example inputs and the earlier module, not for the longer module
    limit = max(len(data) for data in before.values()) + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        with pytest.raises(OSError):
            ndd_trace.export(_flipped_forty_times, frames, path=str(path))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    after = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    assert after == before  # no partial module, no temporary file left beside it


def test_export_takes_bytes_and_path_objects_as_file_names(tmp_path, monkeypatch):
    """The example inputs go beside the module, under the name its `EXAMPLE` gives, whichever
    form the file name takes."""
    import pathlib

    frames = ndd.as_batch([np.zeros((4, 4, 3), np.uint8)] * 2, layout="HWC")
    monkeypatch.chdir(tmp_path)
    for name, path in (("as_bytes", b"as_bytes.py"),
                       ("as_path", pathlib.Path("as_path.py"))):
        exported = ndd_trace.export(_flipped, frames, path=path)
        assert exported.path == f"{name}.py"
        assert exported.example_path == f"{name}_example.npz"
        assert f"EXAMPLE = '{name}_example.npz'" in (tmp_path / f"{name}.py").read_text()
    assert sorted(os.listdir(tmp_path)) == ["as_bytes.py", "as_bytes_example.npz", "as_path.py",
                                            "as_path_example.npz"]
    with pytest.raises(TypeError, match="`path`"):
        ndd_trace.export(_flipped, frames, path=3)


# -- the warm-start cache's trust boundary (docs/warm-start.md, "What the cache trusts") --------

USER_MODULE = '''
import numpy as np
import nvidia.dali.experimental.dynamic as ndd

MEAN = [10.0, 20.0, 30.0]  # a list bound to a name: ndd asks DALI's call-site analysis


@ndd.compile
def prep(images):
    return ndd.crop_mirror_normalize(images, mean=MEAN, std=[2.0, 2.0, 2.0]) * 2
'''


class _Planted:
    """What another user puts in the cache: a pickle that runs code (here: makes a file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.fixture
def cache_dir(tmp_path):
    """A cache directory of the test's own, the process's one restored after it."""
    previous = ndd_trace.cache_dir()
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    yield directory
    ndd_trace.set_cache_dir(previous)


def _user_module(folder, name):
    """A module of the user's (a file of its own: the cache is per module), imported."""
    import importlib.util

    path = folder / f"{name}.py"
    path.write_text(USER_MODULE)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _entry_name(module):
    """The cache entry a module's parse is kept under (what another user would plant)."""
    import linecache

    from ndd_trace._dali import analysis

    return f"analysis-{analysis._key(''.join(linecache.getlines(module.__file__)))}.pickle"


def _prepared(module, images):
    """`module.prep` (compiled) on the images, run first: eager would parse the module itself."""
    return run(module.prep, ndd.as_batch(images, layout="HWC"), seed=None, warn=None)


def _prepared_eagerly(module, images):
    return run(module.prep.__wrapped__, ndd.as_batch(images, layout="HWC"), seed=None,
               warn=None)


def _plant(path, marker):
    with open(path, "wb") as file:
        pickle.dump(_Planted(marker), file)


def test_a_symlinked_cache_entry_is_refused_with_one_warning(cache_dir, tmp_path, images):
    """A cache in a shared sticky folder, like /tmp (others may add files, not replace ours):
    another user's link in it, to a pickle of theirs, is never followed, and the cache is
    off for the process, said once."""
    cache_dir.chmod(0o1777)
    ndd_trace.set_cache_dir(str(cache_dir))
    first, second = _user_module(tmp_path, "augment_a"), _user_module(tmp_path, "augment_b")
    marker = tmp_path / "planted-code-ran"
    _plant(tmp_path / "theirs.pickle", marker)
    (cache_dir / _entry_name(first)).symlink_to(tmp_path / "theirs.pickle")
    with pytest.warns(ndd_trace.NddTraceWarning, match="is a symbolic link") as warned:
        compiled = _prepared(first, images)
        assert_runs_match(_prepared_eagerly(first, images), compiled)
        compiled = _prepared(second, images)
        assert_runs_match(_prepared_eagerly(second, images), compiled)
    assert len([w for w in warned if "cache" in str(w.message)]) == 1
    (warning,) = [w for w in warned if "cache" in str(w.message)]
    assert warning.filename == first.__file__  # at the user's line
    assert "Delete" in str(warning.message) and str(cache_dir) in str(warning.message)
    assert not marker.exists()
    assert sorted(os.listdir(cache_dir)) == [_entry_name(first)]  # nothing saved there either


def test_a_cache_directory_others_may_write_to_is_refused(cache_dir, tmp_path, images):
    cache_dir.chmod(0o777)  # no sticky bit: another user could replace the entries
    ndd_trace.set_cache_dir(str(cache_dir))
    module = _user_module(tmp_path, "augment_c")
    with pytest.warns(ndd_trace.NddTraceWarning, match="mode 0777"):
        compiled = _prepared(module, images)
        assert_runs_match(_prepared_eagerly(module, images), compiled)
    assert os.listdir(cache_dir) == []


def test_a_cache_directory_that_names_a_file_is_refused_with_one_warning(cache_dir, tmp_path,
                                                                         images):
    """`NDD_TRACE_CACHE_DIR=model.ckpt` (a file, as a typo makes it): the warm start is off,
    said once at the user's line (it was said in the cache log only, at every module)."""
    from ndd_trace._dali import analysis

    named = tmp_path / "model.ckpt"
    named.write_bytes(b"weights")
    analysis.set_directory(str(named))  # (as NDD_TRACE_CACHE_DIR sets it at start-up)
    first, second = _user_module(tmp_path, "augment_f"), _user_module(tmp_path, "augment_g")
    with pytest.warns(ndd_trace.NddTraceWarning, match="cannot be used: File exists") as warned:
        assert_runs_match(_prepared_eagerly(first, images), _prepared(first, images))
        assert_runs_match(_prepared_eagerly(second, images), _prepared(second, images))
    (warning,) = [w for w in warned if "cache directory" in str(w.message)]
    assert warning.filename == first.__file__ and "unset NDD_TRACE_CACHE_DIR" in \
        str(warning.message)
    assert named.read_bytes() == b"weights"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="makes files of another user (root only)")
def test_a_cache_directory_of_another_user_is_refused(cache_dir, tmp_path, images):
    """pip disables such a cache, and so does ndd_trace: the planted pickle does not run."""
    module = _user_module(tmp_path, "augment_d")
    marker = tmp_path / "planted-code-ran"
    _plant(cache_dir / _entry_name(module), marker)
    os.chown(cache_dir / _entry_name(module), 65534, 65534)
    os.chown(cache_dir, 65534, 65534)
    cache_dir.chmod(0o1777)
    ndd_trace.set_cache_dir(str(cache_dir))
    with pytest.warns(ndd_trace.NddTraceWarning, match="is owned by uid 65534"):
        compiled = _prepared(module, images)
        assert_runs_match(_prepared_eagerly(module, images), compiled)
    assert not marker.exists()


def test_a_cache_entry_of_ours_that_is_no_parse_is_a_miss(cache_dir, tmp_path, images):
    """An entry of the user's own that holds something else (a pickle naming other code, or
    another object) is not used, runs nothing, and is made again."""
    ndd_trace.set_cache_dir(str(cache_dir))
    marker = tmp_path / "planted-code-ran"
    for name, content in (("augment_e", _Planted(marker)), ("augment_f", {"not": "a parse"})):
        module = _user_module(tmp_path, name)
        entry = cache_dir / _entry_name(module)
        with open(entry, "wb") as file:
            pickle.dump(content, file)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ndd_trace.NddTraceWarning)
            compiled = _prepared(module, images)
            assert_runs_match(_prepared_eagerly(module, images), compiled)
        assert not marker.exists()
        # DALI's parse, saved in its place
        assert type(pickle.loads(entry.read_bytes())).__name__ == "ModuleInfo"


def test_a_symlinked_tuning_file_is_refused(cache_dir, tmp_path):
    """optimize=True's per-machine settings, kept in the same directory, are read only from a
    file of the user's own: another user's link turns the cache off, and nothing is written
    through it."""
    from ndd_trace.execution import tuning_store
    from ndd_trace.execution.tuning_store import current_store

    cache_dir.chmod(0o1777)
    ndd_trace.set_cache_dir(str(cache_dir))
    tuning_store.forget()
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"format": 1, "entries": {"k": {"num_threads": 64}}}')
    link = current_store().path
    os.symlink(theirs, link)
    try:
        with pytest.warns(ndd_trace.NddTraceWarning, match="is a symbolic link"):
            assert current_store().get("k") is None
        current_store().put("k", {"num_threads": 1, "prefetch_queue_depth": 2})
        assert current_store().get("k")["num_threads"] == 1  # kept in this process only
    finally:
        tuning_store.forget()
    assert os.listdir(cache_dir) == [os.path.basename(link)] and os.path.islink(link)
    assert "64" in theirs.read_text()


def _tune_many(directory, rank, count, start):
    """One process's tuning decisions (a torchrun rank's), kept one by one, all ranks at once."""
    from ndd_trace.execution import tuning_store

    store = tuning_store.Store(directory)
    start.wait()
    for index in range(count):
        store.put(f"rank{rank}-{index}", {"num_threads": 1, "prefetch_queue_depth": 2,
                                          "hw_decoder_load": None})


def test_ranks_keeping_tuning_at_once_lose_nothing_when_its_lock_file_cannot_be_opened(tmp_path):
    """`tuning-<machine>.json.lock` is a directory here (another tool's, a user's mistake), as
    it may be another user's file: the ranks still take turns, and every decision is kept."""
    import json
    import multiprocessing

    from ndd_trace.execution import tuning_store

    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    kept = tuning_store.Store(str(directory)).path
    os.mkdir(kept + ".lock")
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(4)
    workers = [context.Process(target=_tune_many, args=(str(directory), rank, 50, start))
               for rank in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    with open(kept) as file:
        entries = json.load(file)["entries"]
    assert set(entries) == {f"rank{rank}-{index}" for rank in range(4) for index in range(50)}


SPAWNING_SCRIPT = '''
import multiprocessing

import numpy as np
import nvidia.dali.experimental.dynamic as ndd


def crop_in_a_child():
    images = ndd.as_batch([np.ones((4, 4, 3), np.uint8)] * 2, layout="HWC")
    print("child", int(ndd.crop(images, crop=[2, 2]).torch().sum()), flush=True)


if __name__ == "__main__":
    images = ndd.as_batch([np.ones((4, 4, 3), np.uint8)] * 2, layout="HWC")
    print("parent", int((ndd.flip(images, horizontal=1) * 3).torch().sum()), flush=True)
    child = multiprocessing.get_context("spawn").Process(target=crop_in_a_child)
    child.start()
    child.join(120)
'''


def test_a_spawned_child_writes_its_report_beside_its_parents(tmp_path):
    """`NDD_TRACE=1 NDD_TRACE_REPORT=report.json python script.py`, no RANK, the script
    starting a spawn child (a DataLoader worker's way): each process keeps its own report, the
    script's under the name given, the child's under its pid."""
    import json
    import re
    import shutil

    (tmp_path / "script.py").write_text(SPAWNING_SCRIPT)
    # ndd_trace.pth read at every interpreter's start-up, as once installed (the spawn child's)
    site_dir, startup = tmp_path / "site", tmp_path / "startup"
    site_dir.mkdir()
    startup.mkdir()
    shutil.copy(os.path.join(ROOT, "ndd_trace.pth"), site_dir / "ndd_trace.pth")
    (startup / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site_dir)!r})\n")
    env = subprocess_env(NDD_TRACE="1", NDD_TRACE_REPORT="report.json")
    for name in ("RANK", "LOCAL_RANK", "NDD_TRACE_REPORTS_CLAIMED"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(startup), env["PYTHONPATH"]])
    completed = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split() == ["parent", "288", "child", "24"]
    reports = sorted(path.name for path in tmp_path.glob("report*.json"))
    assert len(reports) == 2 and "report.json" in reports, reports
    (child_report,) = [name for name in reports if name != "report.json"]
    parent = json.loads((tmp_path / "report.json").read_text())
    child = json.loads((tmp_path / child_report).read_text())
    assert re.fullmatch(r"report\.pid\d+\.json", child_report)
    assert child_report == f"report.pid{child['pid']}.json" and parent["pid"] != child["pid"]
    assert (parent["ops_recorded"], child["ops_recorded"]) == (2, 1)
