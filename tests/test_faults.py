"""Faults do not poison state: after a corrupt file, a compiled loop goes on as the eager loop does.

Each scenario runs a reader loop eagerly and through a compiled generator (or transparent mode),
with a truncated JPEG among real photos, and compares what the consumer sees step by step: the
steps that decode, the values, the step that raises (and the exception, its type and text), and
the loops of later epochs.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import Fresh, Step, assert_matches_eager, assert_runs_match, run

from benchmarks._data import jpeg_paths


@pytest.fixture
def corrupt_dir(jpeg_dir, tmp_path):
    """The photo folder with one file cut short (it fails to decode, every epoch)."""
    root = tmp_path / "photos"
    shutil.copytree(jpeg_dir, root)
    victim = sorted(jpeg_paths(str(root)))[5]
    with open(victim, "rb") as file:
        data = file.read()
    with open(victim, "wb") as file:
        file.write(data[: len(data) // 3])
    return str(root)


def _body(reader):
    for jpegs, labels in reader.next_epoch(batch_size=4):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[24, 24])
        noise = ndd.random.uniform(batch_size=images.batch_size, range=[0, 1])
        yield ndd.cast(images, dtype=ndd.float32) + noise, labels


def _consume(generator_function, reader, epochs, skip_errors):
    """What the consumer sees: per step, the values or the exception type; per epoch, its end."""
    seen = []
    for _ in range(epochs):
        try:
            for images, labels in generator_function(reader):
                try:
                    seen.append(("ok", np.stack([np.asarray(s) for s in images.cpu()]),
                                 np.asarray(ndd.as_tensor(labels)).copy()))
                except RuntimeError:
                    seen.append(("error", "RuntimeError"))  # eager: DALI's RuntimeError
                    if not skip_errors:
                        raise
        except RuntimeError:
            seen.append(("epoch ended by the error",))
            continue
        seen.append(("epoch done",))
    return seen


@pytest.mark.parametrize("skip_errors", [False, True], ids=["error-ends-epoch", "skip-bad-batch"])
def test_corrupt_file_in_a_reader_loop(corrupt_dir, skip_errors):
    """From a compiled generator and in transparent mode: the consumer meets the corrupt
    batch's error at its step, the loop ends its epoch there or skips the batch, and the next
    epochs go on as eagerly."""
    reader = Fresh(lambda: ndd.readers.File(file_root=corrupt_dir, random_shuffle=True, seed=3))
    runs = assert_matches_eager(_consume, Step(_body), reader, epochs=3, skip_errors=skip_errors,
                                modes=("step", "transparent"), seed=7)  # the generator's state
    assert ("error", "RuntimeError") in [e[:2] for e in runs["eager"].result]


def test_reader_used_eagerly_first_then_compiled_goes_on_after_errors(corrupt_dir):
    """A reader that gave batches eagerly, then feeds a compiled loop that meets a corrupt
    file: the error at its step, and the next epochs from where eager's reader is."""
    def run(function, reader):
        for _ in reader.next_epoch(batch_size=4):
            break
        return _consume(function, reader, epochs=3, skip_errors=False)

    reader = Fresh(lambda: ndd.readers.File(file_root=corrupt_dir, random_shuffle=True, seed=4))
    runs = assert_matches_eager(run, Step(_body), reader, modes=("step",), seed=2, warn=None)
    assert ("error", "RuntimeError") in [e[:2] for e in runs["eager"].result]


def test_corrupt_file_in_compiled_function(corrupt_dir):
    """A compiled step fed a corrupt batch raises at consumption, as eager's call does; the next
    calls work."""
    files = sorted(jpeg_paths(corrupt_dir))
    good = ndd.as_batch([np.fromfile(f, dtype=np.uint8) for f in files[:4]])
    bad = ndd.as_batch([np.fromfile(f, dtype=np.uint8) for f in files[4:8]])

    def calls(step):
        seen = [step(good).evaluate()]
        try:
            step(bad).evaluate()
        except RuntimeError as error:
            seen.append(error)
        return [*seen, step(good)]

    resize = Step(lambda jpegs: ndd.resize(ndd.decoders.image(jpegs), size=[16, 16]))
    runs = assert_matches_eager(calls, resize, modes=("step",), seed=None)
    assert isinstance(runs["eager"].result[1], RuntimeError)
    assert os.path.isdir(corrupt_dir)


def _decode_epochs(reader_root, run_step, epochs: int = 2) -> list:
    reader = ndd.readers.File(file_root=str(reader_root))
    out = []
    for _ in range(epochs):
        for jpegs, _ in reader.next_epoch(batch_size=4):
            try:
                out.append(int(np.asarray(ndd.as_tensor(run_step(jpegs))).sum()))
            except RuntimeError as error:
                out.append((type(error).__name__, str(error)))
    return out


def _decode(jpegs):
    return ndd.resize(ndd.decoders.image(jpegs), size=[8, 8])


@pytest.mark.parametrize("mode", ["generator", "step", "transparent"])
def test_decode_error_text(corrupt_dir, mode):
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def decoded(reader):
        for jpegs, _ in reader.next_epoch(batch_size=4):
            yield _decode(jpegs)

    def generator_epochs(reader_root, decoded):
        reader = ndd.readers.File(file_root=str(reader_root))
        observed = []
        for _ in range(2):
            for images in decoded(reader):
                try:
                    observed.append(int(np.asarray(ndd.as_tensor(images)).sum()))
                except RuntimeError as error:
                    observed.append((type(error).__name__, str(error)))
        return observed

    eager = run(_decode_epochs, corrupt_dir, _decode, seed=None, warn="quiet")
    if mode == "generator":  # the same epochs, from a compiled generator
        observed = run(generator_epochs, corrupt_dir, Step(decoded), mode="step", seed=None,
                       warn="quiet")
    else:
        observed = run(_decode_epochs, corrupt_dir, Step(_decode), mode=mode, seed=None,
                       warn="quiet")
    assert_runs_match(eager, observed)
    assert ("RuntimeError", "An error happened during asynchronous execution") in eager.result


def test_decode_error_in_a_capture_mode_loop(corrupt_dir):
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def batches(reader, source):
        for extra, (jpegs, _) in zip(source.captured(batch_size=4),
                                     reader.next_epoch(batch_size=4)):
            yield ndd.cast(_decode(jpegs), dtype=ndd.float32) * extra

    def drive(function):
        reader = ndd.readers.File(file_root=str(corrupt_dir))
        source = ndd.ExternalSource([ndd.as_batch([np.ones((1, 1, 1), np.float32)] * 4)
                                     for _ in range(4)], cycle="raise")
        seen = []
        try:
            for images in function(reader, source):
                try:
                    np.asarray(ndd.as_tensor(images))
                    seen.append("ok")
                except RuntimeError:
                    seen.append("failed at use")
        except RuntimeError:
            seen.append("raised by the loop")
        return seen

    runs = assert_matches_eager(drive, Step(batches), modes=("step",), seed=None, warn="quiet")
    assert runs["eager"].result == ["ok", "raised by the loop"]
