"""Compiled loops over readers: same samples, order, shards, random values and RNG state."""

from __future__ import annotations

import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import to_numpy

import ndd_trace


def augmented(reader, batch_size=4):
    for jpegs, labels in reader.next_epoch(batch_size=batch_size):
        images = ndd.decoders.image(jpegs)
        images = ndd.random_resized_crop(images, size=[16, 16])
        flip = ndd.random.coin_flip(batch_size=images.batch_size)
        yield ndd.crop_mirror_normalize(images, mirror=flip, mean=[0.0], std=[1.0]), labels


def two_readers(first, second, batch_size=4):
    for (jpegs, labels), (other, other_labels) in zip(first.next_epoch(batch_size=batch_size),
                                                      second.next_epoch(batch_size=batch_size)):
        yield ndd.resize(ndd.decoders.image(jpegs), size=[8, 8]), labels * 10 + other_labels


def three_readers(a, b, c, batch_size=3):
    for (x, _), (y, _), (z, lz) in zip(a.next_epoch(batch_size=batch_size),
                                       b.next_epoch(batch_size=batch_size),
                                       c.next_epoch(batch_size=batch_size)):
        yield ndd.cast(ndd.reductions.sum(x), dtype=ndd.int64) + ndd.cast(
            ndd.reductions.sum(y), dtype=ndd.int64) - ndd.cast(ndd.reductions.sum(z),
                                                                 dtype=ndd.int64), lz


def epochs(generator_function, make_readers, epochs=3, seed=11, **kwargs):
    readers = make_readers()
    ndd.random.set_seed(seed)
    result = [[to_numpy(step) for step in generator_function(*readers, **kwargs)]
              for _ in range(epochs)]
    return result, str(ndd.random.get_default_rng().state)


def assert_loops_match(generator_function, make_readers, **kwargs):
    compiled = ndd.compile(generator_function)
    eager, eager_state = epochs(generator_function, make_readers, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ndd_trace.NddTraceWarning)
        result, state = epochs(compiled, make_readers, **kwargs)
    assert state == eager_state
    assert len(result) == len(eager)
    for eager_epoch, epoch in zip(eager, result):
        assert_steps_equal(eager_epoch, epoch)
    info = compiled.cache_info()
    assert info.traces == 1 and info.fallbacks == 0, info
    return compiled


def assert_steps_equal(eager_steps, steps):
    """Step by step, output by output, sample by sample: identical arrays."""
    assert len(eager_steps) == len(steps)
    for eager_step, step in zip(eager_steps, steps):
        for eager_output, output in zip(eager_step, step):
            for a, b in zip(eager_output, output):
                np.testing.assert_array_equal(a, b)


def file_reader(root, **kwargs):
    return ndd.readers.File(file_root=str(root), **kwargs)


@pytest.mark.parametrize("options", [
    {},
    {"random_shuffle": True, "seed": 3},
    {"pad_last_batch": True},
    {"shard_id": 1, "num_shards": 3},
    {"shard_id": 0, "num_shards": 2, "stick_to_shard": True, "random_shuffle": True, "seed": 4},
    {"shard_id": 1, "num_shards": 3, "pad_last_batch": True, "random_shuffle": True, "seed": 5},
])
def test_single_reader_matches_eager(jpeg_dir, options):
    assert_loops_match(augmented, lambda: (file_reader(jpeg_dir, **options),))


def test_batch_size_that_does_not_divide_epoch(jpeg_dir):
    assert_loops_match(augmented, lambda: (file_reader(jpeg_dir, random_shuffle=True, seed=9),),
                       batch_size=5)


def test_two_readers(jpeg_dir):
    assert_loops_match(two_readers, lambda: (file_reader(jpeg_dir, random_shuffle=True, seed=1),
                                             file_reader(jpeg_dir, random_shuffle=True, seed=2)))


def test_three_readers(jpeg_dir):
    assert_loops_match(three_readers, lambda: (
        file_reader(jpeg_dir), file_reader(jpeg_dir, random_shuffle=True, seed=7),
        file_reader(jpeg_dir, shard_id=0, num_shards=1)))


def test_break_and_resume_keeps_position(jpeg_dir):
    compiled = ndd.compile(augmented)
    eager_reader, reader = file_reader(jpeg_dir, seed=2, random_shuffle=True), \
        file_reader(jpeg_dir, seed=2, random_shuffle=True)

    def consume(function, reader, stop):
        steps = []
        for step in function(reader):
            steps.append(to_numpy(step))
            if len(steps) == stop:
                break
        return steps

    ndd.random.set_seed(5)
    eager = consume(augmented, eager_reader, 2) + consume(augmented, eager_reader, 99)
    ndd.random.set_seed(5)
    result = consume(compiled, reader, 2) + consume(compiled, reader, 99)
    assert_steps_equal(eager, result)


def test_exception_in_loop_body_leaves_loop_usable(jpeg_dir):
    compiled = ndd.compile(augmented)
    reader = file_reader(jpeg_dir)
    with pytest.raises(ZeroDivisionError):
        for _ in compiled(reader):
            1 / 0
    steps = list(compiled(reader))
    assert steps and compiled.cache_info().traces == 1


def test_eager_use_after_compiled_epoch_continues_like_eager(jpeg_dir):
    """A reader a compiled loop read goes on, in plain eager code, where eager's would."""
    def run(function):
        reader = file_reader(jpeg_dir, random_shuffle=True, seed=6)
        ndd.random.set_seed(3)
        first = [to_numpy(step) for step in function(reader)]
        later = [to_numpy(batches) for batches in reader.next_epoch(batch_size=4)]
        return first, later, reader.get_metadata()["epoch_size"]

    eager, compiled = run(augmented), run(ndd.compile(augmented))
    assert_steps_equal(eager[0], compiled[0])
    assert_steps_equal(eager[1], compiled[1])
    assert eager[2] == compiled[2]


def test_rng_reseeded_between_epochs_matches_eager(jpeg_dir):
    compiled = ndd.compile(augmented)

    def run(function, reader):
        out = []
        for epoch in range(2):
            ndd.random.set_seed(epoch)
            out.append([to_numpy(step) for step in function(reader)])
        return out

    eager = run(augmented, file_reader(jpeg_dir, random_shuffle=True, seed=1))
    result = run(compiled, file_reader(jpeg_dir, random_shuffle=True, seed=1))
    for eager_epoch, epoch in zip(eager, result):
        assert_steps_equal(eager_epoch, epoch)


def test_consumer_draws_from_the_generator_between_steps(jpeg_dir):
    """Mixup: the consumer draws from the default generator at every step; the loop's random
    ops draw after it, as eagerly (runs launched ahead with other states are not used)."""
    def run(function):
        ndd.random.set_seed(8)
        reader = file_reader(jpeg_dir, random_shuffle=True, seed=2)
        steps, lambdas = [], []
        for _ in range(2):
            for step in function(reader):
                lambdas.append(float(np.asarray(ndd.random.uniform(range=[0, 1]))))
                steps.append(to_numpy(step))
        return steps, lambdas, str(ndd.random.get_default_rng().state)

    eager, compiled = run(augmented), run(ndd.compile(augmented))
    assert_steps_equal(eager[0], compiled[0])
    assert eager[1:] == compiled[1:]


def test_data_dependent_loop_body_runs_eagerly_and_says_so(jpeg_dir):
    def dependent(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            if np.asarray(labels.select(0)).item() == 0:
                yield ndd.decoders.image(jpegs), labels
            else:
                yield ndd.flip(ndd.decoders.image(jpegs)), labels

    compiled = ndd.compile(dependent)
    eager = [to_numpy(s) for s in dependent(file_reader(jpeg_dir))]
    with pytest.warns(ndd_trace.NddTraceWarning, match="cannot be compiled whole"):
        result = [to_numpy(s) for s in compiled(file_reader(jpeg_dir))]
    assert_steps_equal(eager, result)


def test_loop_explain_shows_the_loop_and_its_body_pipeline(jpeg_dir):
    compiled = ndd.compile(augmented)
    before = ndd_trace.explain(compiled, file_reader(jpeg_dir))
    assert "not traced yet" in before.graph and "__ndd_trace_step__" in before.loop
    list(compiled(file_reader(jpeg_dir)))
    explanation = ndd_trace.explain(compiled, file_reader(jpeg_dir))
    text = str(explanation)
    assert explanation.eager_reason is None and explanation.path.startswith("compiled loop")
    assert "in __ndd_trace_epoch__((lambda : reader.next_epoch(" in text
    assert "fn.random_resized_crop(" in explanation.code
    assert "test_loops.py:" in explanation.code  # each op carries the user's line


def test_torch_handoff_from_loop(jpeg_dir):
    torch = pytest.importorskip("torch")
    compiled = ndd.compile(augmented)
    for images, labels in compiled(file_reader(jpeg_dir)):
        assert isinstance(images.torch(), torch.Tensor) and images.torch().shape[0] == 4
        assert labels.torch().shape[0] == 4


@pytest.mark.gpu
def test_gpu_loop_matches_eager(jpeg_dir):
    def gpu_loop(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            images = ndd.decoders.image(jpegs, device="gpu")
            yield ndd.random_resized_crop(images, size=[32, 32]), labels

    assert_loops_match(gpu_loop, lambda: (file_reader(jpeg_dir, random_shuffle=True, seed=1),))


@pytest.mark.parametrize("saved, restored", [("compiled", "compiled"), ("eager", "compiled"),
                                             ("compiled", "eager")])
def test_checkpoint_mid_epoch_restores_in_new_process(jpeg_dir, tmp_path, saved, restored):
    """Saved mid-epoch and restored in a fresh process, in any mix of modes: the batches of
    an eager save and restore (the first epoch after a restore is a full one, from the saved
    position, as eager ndd counts it)."""
    import subprocess
    import sys

    from conftest import ROOT, subprocess_env

    worker = [sys.executable, str(ROOT + "/tests/checkpoint_worker.py")]
    env = subprocess_env()

    def run(*args):
        completed = subprocess.run([*worker, *args], capture_output=True, text=True,
                                   timeout=300, env=env)
        assert completed.returncode == 0, completed.stderr
        return [line.split()[1] for line in completed.stdout.splitlines()]

    for stop in (2, 7):  # inside the first epoch, and inside the second
        ckpt = str(tmp_path / f"eager_{stop}.ckpt")
        eager = run("eager", "save", str(jpeg_dir), ckpt, str(stop)) + \
            run("eager", "resume", str(jpeg_dir), ckpt)
        ckpt = str(tmp_path / f"{saved}_{restored}_{stop}.ckpt")
        mixed = run(saved, "save", str(jpeg_dir), ckpt, str(stop)) + \
            run(restored, "resume", str(jpeg_dir), ckpt)
        assert mixed == eager, (stop, mixed, eager)
    full = run("compiled", "full", str(jpeg_dir))
    assert full == run("eager", "full", str(jpeg_dir))


def test_break_reseed_and_resume_recomputes_read_ahead(jpeg_dir):
    """Batches read ahead before a reseed are recomputed with the new states, not dropped."""
    def run(function, reader):
        ndd.random.set_seed(1)
        steps = []
        for step in function(reader):
            steps.append(to_numpy(step))
            break
        ndd.random.set_seed(2)  # the read-ahead batches' states are now stale
        steps += [to_numpy(step) for step in function(reader)]
        ndd.random.set_seed(3)
        steps += [to_numpy(step) for step in function(reader)]
        return steps, str(ndd.random.get_default_rng().state)

    eager, eager_state = run(augmented, file_reader(jpeg_dir, random_shuffle=True, seed=4))
    compiled, state = run(ndd.compile(augmented), file_reader(jpeg_dir, random_shuffle=True,
                                                               seed=4))
    assert state == eager_state
    assert_steps_equal(eager, compiled)


@pytest.mark.parametrize("seed", range(6))
def test_random_epoch_schedules_match_eager(jpeg_dir, seed):
    """Randomized: batch size, shards, padding, breaks and reseeds between and inside epochs."""
    import random

    chooser = random.Random(seed)
    batch_size = chooser.choice([2, 3, 5])
    options = chooser.choice([{}, {"pad_last_batch": True},
                              {"shard_id": 1, "num_shards": 2},
                              {"shard_id": 0, "num_shards": 3, "stick_to_shard": True}])
    plan = [(chooser.choice([None, 1, 2, 3]), chooser.choice([None, 5, 6]))
            for _ in range(4)]  # per epoch: stop after n steps (None: all), reseed before

    def loop(reader):
        for jpegs, labels in reader.next_epoch(batch_size=batch_size):
            images = ndd.resize(ndd.decoders.image(jpegs), size=[8, 8])
            angle = ndd.random.uniform(batch_size=images.batch_size, range=[-40, 40])
            yield ndd.rotate(images, angle=angle, keep_size=True), labels

    def run(function):
        reader = file_reader(jpeg_dir, random_shuffle=True, seed=seed, **options)
        ndd.random.set_seed(100 + seed)
        steps = []
        for stop, reseed in plan:
            if reseed is not None:
                ndd.random.set_seed(reseed)
            for index, step in enumerate(function(reader)):
                steps.append(to_numpy(step))
                if stop is not None and index + 1 == stop:
                    break
        return steps, str(ndd.random.get_default_rng().state)

    eager, eager_state = run(loop)
    compiled, state = run(ndd.compile(loop))
    assert state == eager_state
    assert_steps_equal(eager, compiled)


def test_plain_function_with_reader_loop_runs_regions_and_reports(jpeg_dir):
    """A reader loop inside a plain compiled function, with data-dependent Python in its body:
    exact results, its ndd calls as cached pipeline regions, the reader read ahead."""
    def train_epoch(reader):
        sums = []
        for jpegs, labels in reader.next_epoch(batch_size=4):
            images = ndd.resize(ndd.decoders.image(jpegs), size=[12, 12])
            if int(np.asarray(labels.select(0)).ravel()[0]) == 0:  # data-dependent Python
                images = ndd.flip(images, horizontal=1)
            angle = ndd.random.uniform(batch_size=images.batch_size, range=[-9, 9])
            sums.append(np.asarray(ndd.as_tensor(ndd.rotate(images, angle=angle,
                                                            keep_size=True))))
        return sums

    ndd.random.set_seed(4)
    reader = file_reader(jpeg_dir, random_shuffle=True, seed=2)
    eager = train_epoch(reader) + train_epoch(reader)
    ndd_trace.reset_report()
    compiled = ndd.compile(train_epoch)
    ndd.random.set_seed(4)
    reader = file_reader(jpeg_dir, random_shuffle=True, seed=2)
    with pytest.warns(ndd_trace.NddTraceWarning, match="reader"):
        result = compiled(reader)
    result += compiled(reader)
    assert len(eager) == len(result)
    for a, b in zip(eager, result):
        np.testing.assert_array_equal(a, b)
    report = ndd_trace.report()
    assert any(region.hits for region in report.regions)
    # the fallback reads the reader through a read-ahead pipeline, and says so
    assert sum(report.readers.values()) == 2 and not report.eager_ops


def _es_items(count=5, batch=4, seed=0):
    rng = np.random.default_rng(seed)
    return [ndd.as_batch([rng.integers(0, 255, (8, 8, 3), dtype=np.uint8) for _ in range(batch)],
                         layout="HWC") for _ in range(count)]


def _es_body(images):
    angle = ndd.random.uniform(batch_size=images.batch_size, range=[-20, 20])
    return ndd.rotate(ndd.flip(images, horizontal=1), angle=angle, keep_size=True)


@pytest.mark.parametrize("cycle", ["raise", None])
def test_external_source_loop_runs_in_dalis_capture_mode(cycle):
    """A compiled generator over `source.captured(...)` runs as written: DALI's capture mode
    drives that loop (and prefetches from the source) exactly as it does eagerly; ndd_trace
    says so, once."""
    def captured_loop(source):
        for images in source.captured(batch_size=4):
            yield _es_body(images)

    compiled = ndd.compile(captured_loop)

    def run(function):
        source = ndd.ExternalSource(_es_items(), cycle=cycle)
        ndd.random.set_seed(3)
        epochs = [[to_numpy(step) for step in function(source)] for _ in range(3)]
        return epochs, str(ndd.random.get_default_rng().state)

    eager, eager_state = run(captured_loop)
    with pytest.warns(ndd_trace.NddTraceWarning, match="DALI's capture mode"):
        result, state = run(compiled)
    assert state == eager_state
    assert [len(e) for e in eager] == [len(r) for r in result]
    for e, r in zip(eager, result):
        assert_steps_equal([[s] for s in e], [[s] for s in r])
    assert ndd_trace.explain(compiled).path == "DALI's capture mode"


def test_external_source_zipped_with_reader(jpeg_dir):
    def eager_loop(reader, source):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            yield ndd.resize(ndd.decoders.image(jpegs), size=[8, 8]) + source(batch_size=4)

    def compiled_loop(reader, source):
        for (jpegs, labels), extra in zip(reader.next_epoch(batch_size=4),
                                           source.captured(batch_size=4)):
            yield ndd.resize(ndd.decoders.image(jpegs), size=[8, 8]) + extra

    def run(function):
        reader = file_reader(jpeg_dir)
        source = ndd.ExternalSource(_es_items(count=3), cycle="quiet")
        return [[to_numpy(step) for step in function(reader, source)] for _ in range(2)]

    eager = run(eager_loop)
    result = run(ndd.compile(compiled_loop))
    for e, r in zip(eager, result):
        assert_steps_equal([[s] for s in e], [[s] for s in r])
