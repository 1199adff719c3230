"""Per-machine tuning under optimize=True (execution/tuning.py): the settings it tries change no
values, its decision is kept per machine in the cache directory and used from the next run's
first build, and it stays off where the user chose the settings."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np
import pytest
from conftest import HAS_GPU
from harness import Fresh, Step, assert_matches_eager, assert_runs_match, assert_same, run

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace.core import process_state
from ndd_trace.execution import building, runtime, tuning, tuning_store

SEED = 11


@pytest.fixture(autouse=True)
def quick_tuning(monkeypatch, tmp_path):
    """Short windows (the 2-core CI machine's steps are short), and a cache directory of the
    test's own."""
    monkeypatch.setattr(tuning, "WINDOW", 3)
    monkeypatch.setattr(tuning, "SETTLE", 1)
    monkeypatch.setattr(tuning, "WINDOW_S", 0.0)
    monkeypatch.setattr(tuning, "SEARCH_AFTER_S", 0.0)
    monkeypatch.setattr(tuning, "MIN_STEP_S", 0.0)
    monkeypatch.delenv(tuning.ENV_VAR, raising=False)
    monkeypatch.delenv("NDD_TRACE_HW_DECODER_LOAD", raising=False)
    previous = ndd_trace.cache_dir()
    ndd_trace.set_cache_dir(str(tmp_path / "cache"))
    tuning_store.forget()
    # a search an earlier test left under way holds up no test here
    process_state.tuning_search.clear()
    yield
    ndd_trace.set_cache_dir(previous)
    tuning_store.forget()


def decoded_epoch(reader, device="cpu"):
    for jpegs, labels in reader.next_epoch(batch_size=4):
        images = ndd.decoders.image(jpegs, device=device)
        images = ndd.random_resized_crop(images, size=[16, 16])
        flip = ndd.random.coin_flip(batch_size=images.batch_size)
        yield ndd.flip(images, horizontal=flip), labels


def _steps(function, reader, epochs=10, **kwargs):
    """What a trainer takes of `function`'s steps over `epochs` epochs of `reader`."""
    return [[np.asarray(value.torch().cpu()) for value in step]
            for _ in range(epochs) for step in function(reader, **kwargs)]


def _epochs(function, jpeg_dir, epochs=10, **kwargs):
    """`function`'s steps (read) from SEED and the generator's state after (tests/harness.py
    runs them, and `assert_same` compares them)."""
    steps = run(_steps, function, Fresh(lambda: ndd.readers.File(file_root=str(jpeg_dir))),
                epochs, seed=SEED, warn=None, **kwargs)
    return steps.result, steps.rng


def _tuner(compiled):
    entry = compiled.step.last_entry()
    return entry.executable.tuner


def test_tuning_changes_no_values_and_decides(jpeg_dir, monkeypatch):
    compiled = ndd.compile(decoded_epoch, optimize=True)
    tuned, tuned_state = _epochs(compiled, jpeg_dir)
    tuner = _tuner(compiled)
    assert tuner.state in ("tuned", "kept"), tuner.describe()
    assert len(tuner.measured) >= 3  # the start, then other threads and a deeper queue
    assert {setting.num_threads for setting, _ in tuner.measured} != {tuner.start.num_threads}
    assert any(setting.prefetch_queue_depth > tuner.start.prefetch_queue_depth
               for setting, _ in tuner.measured)
    # the same program with tuning off: bit for bit the same steps and RNG state after them
    monkeypatch.setenv(tuning.ENV_VAR, "0")
    plain = ndd.compile(decoded_epoch, optimize=True)
    untuned, untuned_state = _epochs(plain, jpeg_dir)
    assert _tuner(plain) is None
    assert_same(tuned, untuned)
    assert tuned_state == untuned_state
    assert "tuning: " in str(ndd_trace.explain(compiled))


def test_the_decision_is_kept_per_machine_and_used_from_the_first_build(jpeg_dir, tmp_path):
    first = ndd.compile(decoded_epoch, optimize=True)
    values, _ = _epochs(first, jpeg_dir)
    decided = _tuner(first)
    kept = list((tmp_path / "cache").glob("tuning-*.json"))
    assert len(kept) == 1
    data = json.loads(kept[0].read_text())
    assert data["format"] == tuning_store.FORMAT and data["machine"] == tuning_store.machine()
    (record,) = data["entries"].values()
    assert record["num_threads"] == decided.current.num_threads
    assert record["measured"]
    tuning_store.forget()  # as a new process: read from the file
    second = ndd.compile(decoded_epoch, optimize=True)
    again, _ = _epochs(second, jpeg_dir, epochs=2)
    tuner = _tuner(second)
    assert tuner.state == "loaded" and tuner.current == decided.current
    assert tuner.measured == []
    executable = second.step.last_entry().executable
    assert executable.builds == 1 and executable.options.num_threads == \
        decided.current.num_threads
    assert "kept in" in tuner.describe()
    assert_same(again, values[:len(again)])


def test_threads_given_to_compile_are_not_tuned(jpeg_dir):
    compiled = ndd.compile(decoded_epoch, optimize=True, num_threads=2)
    _epochs(compiled, jpeg_dir)
    tuner = _tuner(compiled)
    assert tuner.measured and {setting.num_threads for setting, _ in tuner.measured} == {2}


def test_no_tuning_without_optimize_or_when_switched_off(jpeg_dir, monkeypatch):
    compiled = ndd.compile(decoded_epoch)
    _epochs(compiled, jpeg_dir, epochs=1)
    assert _tuner(compiled) is None
    monkeypatch.setenv(tuning.ENV_VAR, "off")
    compiled = ndd.compile(decoded_epoch, optimize=True)
    _epochs(compiled, jpeg_dir, epochs=1)
    assert _tuner(compiled) is None


def _starting_threads_only(monkeypatch, built: Callable[[], None] | None = None):
    """Builds of other thread counts than the first pipeline's are refused (or, with `built`,
    let through once `built()` returns)."""
    new_pipeline = building.new_pipeline
    first: list = []

    def starting_threads_only(lowered, options, batch_size, before_build=None):
        if before_build is None:  # (not a reader's pipeline)
            first[:] = first or [options.num_threads]
            if options.num_threads != first[0]:
                if built is None:
                    raise RuntimeError("refused by the test")
                built()
        return new_pipeline(lowered, options, batch_size, before_build)

    monkeypatch.setattr(building, "new_pipeline", starting_threads_only)
    return new_pipeline


def test_a_setting_that_does_not_build_ends_at_the_start(jpeg_dir, monkeypatch):
    new_pipeline = _starting_threads_only(monkeypatch)
    compiled = ndd.compile(decoded_epoch, optimize=True)
    values, _ = _epochs(compiled, jpeg_dir)
    tuner = _tuner(compiled)
    assert tuner.state == "failed" and tuner.current == tuner.start
    assert "did not build" in tuner.describe()
    executable = compiled.step.last_entry().executable
    assert executable.options.num_threads == tuner.start.num_threads
    monkeypatch.setattr(building, "new_pipeline", new_pipeline)
    monkeypatch.setenv(tuning.ENV_VAR, "0")
    plain, _ = _epochs(ndd.compile(decoded_epoch, optimize=True), jpeg_dir)
    assert_same(values, plain)


def test_settings_are_built_while_the_steps_run_on(jpeg_dir, monkeypatch):
    """A setting's pipeline is built by a thread of its own: the loop's steps go on with the
    current settings meanwhile (each build here waits for 3 more steps, which a loop that
    waited for the build would never run), and no value changes."""
    steps = threading.Condition()
    count = [0]
    builds: list = []  # (thread name, whether 3 steps ran while it built)

    def built():
        with steps:
            until = count[0] + 3
            ran_on = steps.wait_for(lambda: count[0] >= until, timeout=20)
        builds.append((threading.current_thread().name, ran_on))

    _starting_threads_only(monkeypatch, built)
    counting = runtime.PendingRun.result

    def result(self, index=None):
        if not self.used:
            with steps:
                count[0] += 1
                steps.notify_all()
        return counting(self, index)

    monkeypatch.setattr(runtime.PendingRun, "result", result)
    compiled = ndd.compile(decoded_epoch, optimize=True)
    values, state = _epochs(compiled, jpeg_dir, epochs=20)
    tuner = _tuner(compiled)
    assert builds and all(name.startswith("ndd_trace build") and ran_on
                          for name, ran_on in builds), builds
    assert {setting.num_threads for setting, _ in tuner.measured} != {tuner.start.num_threads}
    monkeypatch.setenv(tuning.ENV_VAR, "0")
    plain, plain_state = _epochs(ndd.compile(decoded_epoch, optimize=True), jpeg_dir,
                                 epochs=20)
    assert_same(values, plain)
    assert state == plain_state


def test_a_setting_is_timed_with_its_stalls(jpeg_dir, monkeypatch):
    """The rate is the mean over the window, its stalls included: a setting whose steps are
    mostly shorter, but which stalls every 4th step (as a deep CPU-heavy pipeline refills after
    each epoch's end), is slower for the loop than the start, and not chosen."""
    monkeypatch.setattr(tuning, "WINDOW", 8)
    count = [0]
    timed = runtime.PendingRun.result
    starting: list = []

    def result(self, index=None):
        if not self.used and self._executable.tuner is not None:  # (not the reader's runs)
            threads = self._executable.options.num_threads
            starting[:] = starting or [threads]
            count[0] += 1
            if threads == starting[0]:
                time.sleep(0.005)  # 5 ms each
            else:  # 1 ms, and 40 ms every 4th step: a median of 1 ms, a mean of 11 ms
                time.sleep(0.04 if count[0] % 4 == 0 else 0.001)
        return timed(self, index)

    monkeypatch.setattr(runtime.PendingRun, "result", result)
    compiled = ndd.compile(decoded_epoch, optimize=True)
    _epochs(compiled, jpeg_dir, epochs=20)
    tuner = _tuner(compiled)
    others = [rate for setting, rate in tuner.measured if setting.num_threads != starting[0]]
    starts = [rate for setting, rate in tuner.measured if setting.num_threads == starting[0]]
    assert others and max(others) < min(starts), tuner.measured
    assert tuner.current.num_threads == starting[0]


def _searched(start, rates, threads_given=True):
    """The settings a search tries from `start`, each answered with `rates(setting)`; and its
    decision."""
    # (a deeper queue runs no further ahead: not tried)
    plan = tuning.coordinate_descent(start, threads_given, lambda depth: False)
    tried = [next(plan)]
    try:
        while True:
            tried.append(plan.send(rates(tried[-1])))
    except StopIteration as done:
        return tried[1:], done.value


def test_the_load_is_searched_along_its_order():
    start = tuning.Setting(16, 3, 0.65)
    loads = lambda rate_of: lambda setting: rate_of[setting.hw_decoder_load]  # noqa: E731
    # neither neighbour pays: two tries, the start kept
    tried, decision = _searched(start, loads({0.65: 100, 0.9: 90, 0.4: 95, 1.0: 200}))
    assert [s.hw_decoder_load for s in tried] == [0.9, 0.4] and decision == start
    # up pays, and further up: on up, then both confirmed against the start
    tried, decision = _searched(start, loads({0.65: 100, 0.9: 110, 1.0: 120, 0.4: 200}))
    assert [s.hw_decoder_load for s in tried] == [0.9, 1.0, 0.65, 1.0]
    assert decision == dataclasses.replace(start, hw_decoder_load=1.0)
    # up does not pay, down does
    tried, decision = _searched(start, loads({0.65: 100, 0.9: 90, 0.4: 120, 1.0: 200}))
    assert [s.hw_decoder_load for s in tried] == [0.9, 0.4, 0.65, 0.4]
    assert decision.hw_decoder_load == 0.4


def test_a_short_run_is_not_searched(jpeg_dir, monkeypatch):
    """The search begins only once the loop has run SEARCH_AFTER_S seconds: a run shorter than
    that builds no setting and keeps nothing (the H200 run that ended mid-search ran at 0.57x
    the pipeline: its tries' GIL-held builds were most of it)."""
    monkeypatch.setattr(tuning, "SEARCH_AFTER_S", 3600.0)
    compiled = ndd.compile(decoded_epoch, optimize=True)
    _epochs(compiled, jpeg_dir, epochs=4)
    tuner = _tuner(compiled)
    assert tuner.state == "waiting" and tuner.measured == [], tuner.describe()
    assert compiled.step.last_entry().executable.builds == 1
    assert tuning_store.current_store().get(tuner._key()) is None
    assert "searched once the loop has run 3600 s (waiting" in str(ndd_trace.explain(compiled))


def test_short_steps_are_kept_as_they_are(jpeg_dir, monkeypatch):
    monkeypatch.setattr(tuning, "MIN_STEP_S", 10.0)
    compiled = ndd.compile(decoded_epoch, optimize=True)
    _epochs(compiled, jpeg_dir, epochs=2)
    tuner = _tuner(compiled)
    assert tuner.state == "kept" and "too short" in tuner.reason


def test_transparent_mode_tunes_its_regions(jpeg_dir, monkeypatch):
    def script(reader):
        out = []
        for _ in range(10):
            for jpegs, labels in reader.next_epoch(batch_size=4):
                images = ndd.random_resized_crop(ndd.decoders.image(jpegs), size=[16, 16])
                out.append(np.asarray(images.torch()))
        return out

    reader = Fresh(lambda: ndd.readers.File(file_root=str(jpeg_dir)))
    tuned = run(script, reader, mode="transparent", options={"optimize": True}, seed=SEED,
                warn=None)
    assert "tuning: " in str(tuned.report)
    monkeypatch.setenv(tuning.ENV_VAR, "0")
    plain = run(script, reader, mode="transparent", options={"optimize": True}, seed=SEED,
                warn=None)
    assert_runs_match(plain, tuned)  # (their generators' states too)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_gpu_decoder_load_is_tuned(jpeg_dir):
    compiled = ndd.compile(decoded_epoch, optimize=True)
    _epochs(compiled, jpeg_dir, epochs=12, device="gpu")
    tuner = _tuner(compiled)
    assert tuner.state in ("tuned", "kept"), tuner.describe()
    loads = {setting.hw_decoder_load for setting, _ in tuner.measured}
    # along the loads' order from the start's: one up first, then on up or one down
    assert 0.9 in loads and len(loads) >= 3, loads
    code = compiled.step.last_entry().executable.lowered.source
    assert f"hw_decoder_load={tuner.current.hw_decoder_load}" in code


def test_machine_names_this_kind_of_machine():
    text = tuning_store.machine()
    assert "CPUs" in text and str(len(os.sched_getaffinity(0))) in text


def _search_started(jpeg_dir):
    """A compiled generator whose tuning began and whose loop then stopped, mid-search."""
    compiled = ndd.compile(decoded_epoch, optimize=True)
    reader = ndd.readers.File(file_root=str(jpeg_dir))
    for _ in range(2):
        for images, _labels in compiled(reader):
            images.torch()
    tuner = _tuner(compiled)
    assert tuner.state == "searching"
    return compiled, tuner


def test_a_stalled_search_gives_way_at_its_starting_settings(jpeg_dir, monkeypatch):
    compiled, tuner = _search_started(jpeg_dir)
    monkeypatch.setattr(tuning, "STALE_S", 0.0)
    other = ndd.compile(decoded_epoch, optimize=True)
    _epochs(other, jpeg_dir)
    assert _tuner(other).measured
    # given up (taken up by its own loop, at its next step: no other thread changes it)
    assert tuner._abandoned and tuner.state == "searching"
    # its loop runs again: its next build takes what the other one decided for the same code
    # (or, with nothing kept, it searches again), with the same values
    monkeypatch.setattr(tuning, "STALE_S", 30.0)
    values, _ = _epochs(compiled, jpeg_dir)
    assert not tuner._abandoned
    assert tuner.state == "loaded" and tuner.current == _tuner(other).current or \
        tuner.state in ("tuned", "kept") and tuner.measured
    monkeypatch.setenv(tuning.ENV_VAR, "0")
    plain, _ = _epochs(ndd.compile(decoded_epoch, optimize=True), jpeg_dir)
    assert_same(values, plain)


def _kept_file(jpeg_dir, tmp_path):
    first = ndd.compile(decoded_epoch, optimize=True)
    values, _ = _epochs(first, jpeg_dir)
    (path,) = (tmp_path / "cache").glob("tuning-*.json")
    return values, path


@pytest.mark.parametrize("bad", [{"num_threads": 0}, {"prefetch_queue_depth": 0},
                                 {"prefetch_queue_depth": "deep"}, {"num_threads": None}])
def test_kept_settings_that_make_no_sense_are_searched_again(jpeg_dir, tmp_path, bad):
    values, path = _kept_file(jpeg_dir, tmp_path)
    data = json.loads(path.read_text())
    for record in data["entries"].values():
        record.update(bad)
    path.write_text(json.dumps(data))
    tuning_store.forget()
    second = ndd.compile(decoded_epoch, optimize=True)
    again, _ = _epochs(second, jpeg_dir)
    assert _tuner(second).state in ("tuned", "kept") and _tuner(second).measured
    assert_same(again, values)


def test_kept_settings_that_do_not_build_fall_back_to_the_start(jpeg_dir, tmp_path,
                                                                 monkeypatch):
    values, path = _kept_file(jpeg_dir, tmp_path)
    data = json.loads(path.read_text())
    for record in data["entries"].values():
        record["num_threads"] = 1  # not the start's (2 threads), and refused below
    path.write_text(json.dumps(data))
    tuning_store.forget()
    options = runtime._dali.pipeline_options

    def refusing(batch_size, num_threads, *args, **kwargs):
        if num_threads == 1:
            raise RuntimeError("refused by the test")
        return options(batch_size, num_threads, *args, **kwargs)

    monkeypatch.setattr(runtime._dali, "pipeline_options", refusing)
    second = ndd.compile(decoded_epoch, optimize=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ndd_trace.NddTraceWarning)  # no fallback to eager
        again, _ = _epochs(second, jpeg_dir)
    tuner = _tuner(second)
    assert tuner.state == "failed" and tuner.current == tuner.start
    assert second.step.last_entry().eager_reason is None
    assert json.loads(path.read_text())["entries"] == {}  # dropped: the next run searches
    assert_same(again, values)


def flipped_epoch(reader):
    for jpegs, labels in reader.next_epoch(batch_size=4):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[16, 16])
        flip = ndd.random.coin_flip(batch_size=images.batch_size)
        yield ndd.flip(images, horizontal=flip), flip, labels


def test_tuned_steps_are_eager_s_where_no_rewrite_changes_values(jpeg_dir):
    """Parity with eager itself (not only with untuned optimize): no rewrite touches these ops
    on the CPU, so while tuning rebuilds the pipeline, every step is eager's, bit for bit."""
    reader = Fresh(lambda: ndd.readers.File(file_root=str(jpeg_dir)))
    runs = assert_matches_eager(_steps, Step(flipped_epoch, optimize=True), reader,
                                modes=("step",), seed=SEED, warn=None)
    compiled = runs["step"].steps[0]
    assert _tuner(compiled).measured  # settings were tried while these steps ran
    assert not compiled.step.last_entry().optimizations  # nothing rewritten


def _put_many(directory: str, rank: int, count: int) -> None:
    """One process's decisions (a torchrun rank's), put one by one."""
    store = tuning_store.Store(directory)
    for index in range(count):
        store.put(f"rank{rank}-{index}", {"num_threads": 1, "prefetch_queue_depth": 2,
                                          "hw_decoder_load": None})


def test_processes_writing_the_file_at_once_lose_no_entry(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    directory = str(tmp_path / "shared")
    workers = [context.Process(target=_put_many, args=(directory, rank, 25)) for rank in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    (kept,) = (tmp_path / "shared").glob("tuning-*.json")
    entries = json.loads(kept.read_text())["entries"]
    assert set(entries) == {f"rank{rank}-{index}" for rank in range(4) for index in range(25)}
    assert not list((tmp_path / "shared").glob("*.tmp"))
