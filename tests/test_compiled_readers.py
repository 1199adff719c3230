"""A compiled step called from the user's eager reader loop (the README pattern): once the step
is fed a reader's batch, the rest of that epoch and the later ones stream, and the step runs
ahead on the batches read ahead, checked; everything must equal the plain eager loop, bit for
bit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from conftest import subprocess_env
from harness import Fresh, Step, assert_matches_eager
from test_streams import (  # the same readers, augmentation and file changes
    _arrays, _augment, _epochs_between, _fresh_arrays, _fresh_photos, _photos, _reader, _truncate)

import ndd_trace
from ndd_trace.ahead.streams import stream_of


def _ahead(compiled):
    return sum(entry.executable.ahead for entry in compiled.entries if entry.executable)


def test_later_epochs_stream_and_steps_run_ahead(jpeg_dir):
    def scenario(reader, step):
        out = []
        for _ in range(4):
            for jpegs, labels in reader.next_epoch(batch_size=4):
                out.append((np.asarray(step(jpegs).torch()), np.asarray(labels.torch())))
        return out

    runs = assert_matches_eager(scenario, Fresh(lambda: _reader(jpeg_dir)), Step(_augment),
                                modes=("step",))
    compiled, reader = runs["step"].steps[0], runs["step"].args[0]
    assert stream_of(reader) is not None  # fed to a compiled step: streams after epoch 1
    assert _ahead(compiled) >= 6  # 12 streamed steps: all but the first few ran ahead
    assert compiled.cache_info().traces == 1


def test_the_first_epoch_streams_from_its_second_step(jpeg_dir):
    """The switch happens inside the epoch that first fed the step: its remaining batches come
    from the stream (the reader's operator moved there where it stood), as eager gives them,
    and its shard advances once, at the epoch's end."""
    def scenario(reader, step):
        out = []
        for epoch_steps in (None, 2, None):  # a whole epoch, one left by a break, a whole one
            for index, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=2)):
                out.append((np.asarray(step(jpegs).torch()), np.asarray(labels.torch())))
                if index == epoch_steps:
                    break
        return out

    runs = assert_matches_eager(scenario, Fresh(lambda: _reader(jpeg_dir)), Step(_augment),
                                modes=("step",))
    compiled, reader = runs["step"].steps[0], runs["step"].args[0]
    assert stream_of(reader) is not None
    assert _ahead(compiled) >= 3
    compiled = ndd.compile(_augment)
    reader = _reader(jpeg_dir)
    for jpegs, _ in reader.next_epoch(batch_size=2):  # one epoch: it streams from its 2nd step
        np.asarray(compiled(jpegs).torch())
    assert stream_of(reader) is not None and _ahead(compiled) >= 2


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

    assert_matches_eager(scenario, Fresh(lambda: _reader(jpeg_dir)), Step(_augment),
                         modes=("step",))


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

    compiled = assert_matches_eager(scenario, Fresh(lambda: _reader(jpeg_dir)), Step(_augment),
                                    modes=("step",))["step"].steps[0]
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

    assert_matches_eager(scenario, Fresh(lambda: _reader(jpeg_dir)), Step(step), modes=("step",))


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

    assert_matches_eager(scenario, Fresh(make), Step(_augment), modes=("step",))


def test_two_readers_in_one_call(jpeg_dir):
    def step(a, b):
        return ndd.resize(ndd.decoders.image(a), size=[8, 8]) + \
            ndd.resize(ndd.decoders.image(b), size=[8, 8])

    def scenario(readers, function):
        first, second = readers
        return [function(a, b) for _ in range(4)
                for (a, _), (b, _) in zip(first.next_epoch(batch_size=4),
                                          second.next_epoch(batch_size=4))]

    assert_matches_eager(scenario, Fresh(lambda: (_reader(jpeg_dir), _reader(jpeg_dir, seed=9))),
                         Step(step), modes=("step",))


@pytest.mark.parametrize("kwargs", [
    {"num_shards": 3, "shard_id": 1},
    {"num_shards": 3, "shard_id": 2, "stick_to_shard": True, "pad_last_batch": True},
])
def test_shards(jpeg_dir, kwargs):
    def scenario(reader, step):
        return [[np.asarray(labels.torch()), step(jpegs)]
                for _ in range(4) for jpegs, labels in reader.next_epoch(batch_size=3)]

    assert_matches_eager(scenario, Fresh(lambda: _reader(jpeg_dir, **kwargs)), Step(_augment),
                         modes=("step",))


def test_checkpointing_reader_stays_eager_with_exact_state(jpeg_dir):
    def scenario(reader, step):
        out = []
        for _ in range(2):
            for index, (jpegs, _) in enumerate(reader.next_epoch(batch_size=4)):
                out.append(step(jpegs))
                if index == 1:
                    out.append(str(reader.get_state()))
        return out

    def make():
        return _reader(jpeg_dir, enable_checkpointing=True)

    reader = assert_matches_eager(scenario, Fresh(make), Step(_augment),
                                  modes=("step",))["step"].args[0]
    assert stream_of(reader) is None


def test_values_consumed_after_the_loop(jpeg_dir):
    def scenario(reader, step):
        return [step(jpegs) for _ in range(3) for jpegs, _ in reader.next_epoch(batch_size=4)]

    assert_matches_eager(scenario, Fresh(lambda: _reader(jpeg_dir)), Step(_augment),
                         modes=("step",))


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

    assert_matches_eager(scenario, Step(_augment), modes=("step",), seed=None)


def test_transparent_mode_and_compiled_steps_together(jpeg_dir):
    def scenario(reader, step):
        out = []
        for epoch in range(3):
            with ndd_trace.enabled() if epoch == 1 else _nothing():
                for jpegs, _ in reader.next_epoch(batch_size=4):
                    out.append(np.asarray(step(jpegs).torch()))
        return out

    assert_matches_eager(scenario, Fresh(lambda: _reader(jpeg_dir)), Step(_augment),
                         modes=("step",))


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

    def scenario(reader, first, second):
        return [[first(jpegs), second(jpegs)] for _ in range(4)
                for jpegs, _ in reader.next_epoch(batch_size=4)]

    runs = assert_matches_eager(scenario, Fresh(lambda: _reader(jpeg_dir)), Step(_augment),
                                Step(flip), modes=("step",), seed=3)
    assert all(_ahead(step) > 0 for step in runs["step"].steps)


# -- files changed between epochs, read by a compiled generator (see test_streams) --


def _decoded(reader):
    for jpegs, labels in reader.next_epoch(batch_size=4):
        yield ndd.resize(ndd.decoders.image(jpegs), size=[8, 8]), labels


def _doubled(reader):
    for (arrays,) in reader.next_epoch(batch_size=4):
        yield arrays * 2


@pytest.mark.parametrize("shape", [(6, 5), (3, 11)], ids=["same-size", "other-size"])
def test_generator_reads_files_rewritten_between_epochs(tmp_path, shape):
    root = tmp_path / "arrays"

    def scenario(reader, batches):
        return _epochs_between(lambda: batches(reader),
                               lambda epoch: _arrays(root, epoch, range(5, 16), shape))

    runs = assert_matches_eager(scenario, Fresh(lambda: ndd.readers.Numpy(
        file_root=str(_fresh_arrays(root)))), Step(_doubled), modes=("step",))
    compiled, reader = runs["step"].steps[0], runs["step"].args[0]
    assert stream_of(reader) is not None and compiled.cache_info().traces == 1


@pytest.mark.parametrize("position", [9, 8, 15], ids=["in-its-batch", "first-of-its-batch",
                                                      "last"])
def test_generator_fails_on_a_file_deleted_between_epochs(jpeg_dir, tmp_path, position):
    """Eager's error (its type and DALI's text) at eager's step, then at every later one."""
    root = tmp_path / "photos"

    def scenario(reader, batches):
        victim = _photos(root)[position]
        return _epochs_between(lambda: batches(reader),
                               lambda epoch: victim.unlink() if epoch == 1 else None)

    def make():
        return ndd.readers.File(file_root=str(_fresh_photos(jpeg_dir, root)))

    assert_matches_eager(scenario, Fresh(make), Step(_decoded), modes=("step",))


def test_generator_fails_on_an_array_truncated_between_epochs(tmp_path):
    """An array file cut short: eager's reader error (the data it cannot read), at its step."""
    root = tmp_path / "arrays"

    def scenario(reader, batches):
        return _epochs_between(lambda: batches(reader),
                               lambda epoch: _truncate(root / "010.npy", 140) if epoch == 1
                               else None)

    def make():
        return ndd.readers.Numpy(file_root=str(_fresh_arrays(root)))

    assert_matches_eager(scenario, Fresh(make), Step(_doubled), modes=("step",))


def test_step_called_from_an_eager_loop_reads_files_changed_between_epochs(jpeg_dir, tmp_path):
    """The README pattern (the reader streams from its second epoch): a photo replaced by
    another of a different size, then one deleted, as eagerly."""
    root = tmp_path / "photos"

    def change(epoch):
        photos = _photos(root)
        if epoch == 1:
            photos[11].write_bytes(photos[3].read_bytes())  # the same file, rewritten
        else:
            photos[13].unlink()

    def scenario(reader, step):
        return _epochs_between(lambda: (np.asarray(step(jpegs).torch())
                                        for jpegs, _ in reader.next_epoch(batch_size=4)),
                               change, epochs=4)

    def make():
        return _reader(_fresh_photos(jpeg_dir, root), random_shuffle=False)

    assert_matches_eager(scenario, Fresh(make), Step(_augment), modes=("step",))


def test_files_cut_short_between_epochs_do_not_kill_the_process(tmp_path):
    """Every array cut short between epochs (eager ndd, which maps the next epoch's first files
    as an epoch ends, dies of SIGBUS here): a compiled generator and transparent mode raise the
    reader's error instead (the stream reads files into memory)."""
    script = textwrap.dedent('''
        import os, sys
        import numpy as np
        import nvidia.dali.experimental.dynamic as ndd
        import ndd_trace

        def doubled(reader):
            for (arrays,) in reader.next_epoch(batch_size=4):
                yield arrays * 2

        def run(batches, root):
            os.makedirs(root)
            for index in range(16):
                np.save(os.path.join(root, f"{index:03d}.npy"),
                        np.full((128, 128), index, np.float32))
            reader = ndd.readers.Numpy(file_root=root)
            seen = []
            for epoch in range(3):
                if epoch == 1:
                    for name in os.listdir(root):  # past the first page of each file
                        os.truncate(os.path.join(root, name), 200)
                try:
                    for batch in batches(reader):
                        seen.append(len(batch.tensors))
                except RuntimeError:
                    seen.append("error")
            return seen

        print(run(ndd.compile(doubled), sys.argv[1] + "/compiled"))
        with ndd_trace.enabled():
            print(run(doubled, sys.argv[1] + "/transparent"))
    ''')
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=subprocess_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split("\n")[:2] == ["[4, 4, 4, 4, 'error', 'error']"] * 2, result.stdout
