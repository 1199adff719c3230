"""A compiled step called from the user's eager reader loop (the README pattern): once the step
is fed a reader's batches, that reader streams from its next epoch and the step runs ahead on
the batches read ahead, checked; everything must equal the plain eager loop, bit for bit."""

from __future__ import annotations

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from conftest import assert_same, to_numpy
from test_transparent_readers import _augment, _reader  # the same readers and augmentation

import ndd_trace
from ndd_trace.ahead.readahead import stream_of


def _both(scenario, make_reader, seed=11, function=_augment):
    """Run `scenario(reader, step)` with the eager function and with it compiled (fresh
    readers, same seed); compare everything and the generator state afterwards. Returns the
    compiled function and the compiled run's readers."""
    ndd.random.set_seed(seed)
    eager = to_numpy(scenario(make_reader(), function))
    eager_state = str(ndd.random.get_default_rng().state)
    compiled = ndd.compile(function)
    ndd.random.set_seed(seed)
    readers = make_reader()
    result = to_numpy(scenario(readers, compiled))
    assert str(ndd.random.get_default_rng().state) == eager_state
    assert_same(eager, result)
    return compiled, readers


def _ahead(compiled):
    return sum(entry.executable.ahead for entry in compiled.entries if entry.executable)


def test_later_epochs_stream_and_steps_run_ahead(jpeg_dir):
    def scenario(reader, step):
        out = []
        for _ in range(4):
            for jpegs, labels in reader.next_epoch(batch_size=4):
                out.append((np.asarray(step(jpegs).torch()), np.asarray(labels.torch())))
        return out

    compiled, reader = _both(scenario, lambda: _reader(jpeg_dir))
    assert stream_of(reader) is not None  # fed to a compiled step: streams after epoch 1
    assert _ahead(compiled) >= 6  # 12 streamed steps: all but the first few ran ahead
    assert compiled.cache_info().traces == 1


def test_reader_not_fed_to_a_compiled_step_stays_eager(jpeg_dir):
    compiled = ndd.compile(_augment)
    reader = _reader(jpeg_dir)
    for _ in range(2):
        for _jpegs, labels in reader.next_epoch(batch_size=4):
            np.asarray(labels.torch())
    assert stream_of(reader) is None
    del compiled


def test_breaks_mid_epoch(jpeg_dir):
    def scenario(reader, step):
        out = []
        for stop in (2, None, 1, None, 0, None):
            for index, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=3)):
                out.append(step(jpegs))
                out.append(labels)
                if index == stop:
                    break
        return out

    _both(scenario, lambda: _reader(jpeg_dir))


def test_reseed_between_epochs_and_extra_draws(jpeg_dir):
    def scenario(reader, step):
        out = []
        for epoch in range(4):
            ndd.random.set_seed(100 + epoch % 2)
            for index, (jpegs, _) in enumerate(reader.next_epoch(batch_size=2)):
                if index == 2:  # a draw the runs launched ahead did not foresee
                    out.append(np.asarray(ndd.random.uniform(batch_size=2, range=[0, 1]).torch()))
                out.append(np.asarray(step(jpegs).torch()))
        return out

    compiled, _ = _both(scenario, lambda: _reader(jpeg_dir))
    assert _ahead(compiled) > 0


def test_explicit_rng_argument(jpeg_dir):
    def step(jpegs, rng):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[12, 12])
        return ndd.flip(images, horizontal=ndd.random.coin_flip(batch_size=images.batch_size,
                                                                 rng=rng))

    def scenario(reader, function):
        rng = ndd.random.RNG(seed=5)
        return [function(jpegs, rng) for _ in range(3)
                for jpegs, _ in reader.next_epoch(batch_size=4)] + [rng()]

    _both(scenario, lambda: _reader(jpeg_dir), function=step)


def test_two_readers(jpeg_dir):
    def make():
        return _reader(jpeg_dir), _reader(jpeg_dir, seed=3, num_shards=2, shard_id=1)

    def scenario(readers, step):
        first, second = readers
        out = []
        for _ in range(3):  # zip pulls one extra batch from `first`, as eagerly
            for (a, _), (b, labels) in zip(first.next_epoch(batch_size=3),
                                           second.next_epoch(batch_size=3)):
                out += [step(a), step(b), labels]
        return out

    _both(scenario, make)


def test_two_readers_in_one_call(jpeg_dir):
    def step(a, b):
        return ndd.resize(ndd.decoders.image(a), size=[8, 8]) + \
            ndd.resize(ndd.decoders.image(b), size=[8, 8])

    def scenario(readers, function):
        first, second = readers
        return [function(a, b) for _ in range(4)
                for (a, _), (b, _) in zip(first.next_epoch(batch_size=4),
                                          second.next_epoch(batch_size=4))]

    _both(scenario, lambda: (_reader(jpeg_dir), _reader(jpeg_dir, seed=9)), function=step)


@pytest.mark.parametrize("kwargs", [
    {"num_shards": 3, "shard_id": 1},
    {"num_shards": 3, "shard_id": 2, "stick_to_shard": True, "pad_last_batch": True},
])
def test_shards(jpeg_dir, kwargs):
    def scenario(reader, step):
        return [[np.asarray(labels.torch()), step(jpegs)]
                for _ in range(4) for jpegs, labels in reader.next_epoch(batch_size=3)]

    _both(scenario, lambda: _reader(jpeg_dir, **kwargs))


def test_checkpointing_reader_stays_eager_with_exact_state(jpeg_dir):
    def scenario(reader, step):
        out = []
        for _ in range(2):
            for index, (jpegs, _) in enumerate(reader.next_epoch(batch_size=4)):
                out.append(step(jpegs))
                if index == 1:
                    out.append(str(reader.get_state()))
        return out

    _, reader = _both(scenario, lambda: _reader(jpeg_dir, enable_checkpointing=True))
    assert stream_of(reader) is None


def test_values_consumed_after_the_loop(jpeg_dir):
    def scenario(reader, step):
        return [step(jpegs) for _ in range(3) for jpegs, _ in reader.next_epoch(batch_size=4)]

    _both(scenario, lambda: _reader(jpeg_dir))


def test_streamed_reader_refuses_sample_epochs_as_eager(jpeg_dir):
    """Samples from a reader that gave batch epochs: eager's own RuntimeError, at the first
    step, whether the reader streams or not."""
    def scenario(compiled):
        reader = _reader(jpeg_dir)
        for _ in range(2):
            for jpegs, _ in reader.next_epoch(batch_size=4):
                compiled(jpegs)
        epoch = reader.next_epoch()  # nothing raises yet
        with pytest.raises(RuntimeError) as raised:
            next(iter(epoch))
        return type(raised.value), str(raised.value)

    assert scenario(ndd.compile(_augment)) == scenario(_augment)


def test_transparent_mode_and_compiled_steps_together(jpeg_dir):
    def scenario(reader, step):
        out = []
        for epoch in range(3):
            with ndd_trace.enabled() if epoch == 1 else _nothing():
                for jpegs, _ in reader.next_epoch(batch_size=4):
                    out.append(np.asarray(step(jpegs).torch()))
        return out

    _both(scenario, lambda: _reader(jpeg_dir))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_two_compiled_steps_on_one_reader(jpeg_dir):
    """Two functions with equal guard keys fed the same batches: each uses its own runs."""
    def flip(jpegs):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[10, 10])
        return ndd.flip(images, horizontal=ndd.random.coin_flip(batch_size=images.batch_size))

    def scenario(reader, steps):
        first, second = steps
        return [[first(jpegs), second(jpegs)] for _ in range(4)
                for jpegs, _ in reader.next_epoch(batch_size=4)]

    ndd.random.set_seed(3)
    eager = to_numpy(scenario(_reader(jpeg_dir), (_augment, flip)))
    ndd.random.set_seed(3)
    steps = (ndd.compile(_augment), ndd.compile(flip))
    assert_same(eager, to_numpy(scenario(_reader(jpeg_dir), steps)))
    assert all(_ahead(step) > 0 for step in steps)
