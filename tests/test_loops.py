"""Compiled loops over readers: same samples, order, shards, random values and RNG state."""

from __future__ import annotations

import contextlib

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
import training_config
from harness import Fresh, Step, assert_matches_eager, assert_runs_match, observe, run

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


# a compiled loop over three epochs of the same readers: what eager's gives, traced once, all
# compiled (the harness's mode "loop", one call an epoch)
EPOCHS = {"modes": ("loop",), "calls": 3, "seed": 11, "exact_paths": True}


def file_reader(root, **kwargs):
    return ndd.readers.File(file_root=str(root), **kwargs)


def fresh_reader(root, **kwargs):
    """A File reader made anew for each of the harness's runs."""
    return Fresh(lambda: file_reader(root, **kwargs))


@pytest.mark.parametrize("options", [
    {},
    {"random_shuffle": True, "seed": 3},
    {"pad_last_batch": True},
    {"shard_id": 1, "num_shards": 3},
    {"shard_id": 0, "num_shards": 2, "stick_to_shard": True, "random_shuffle": True, "seed": 4},
    {"shard_id": 1, "num_shards": 3, "pad_last_batch": True, "random_shuffle": True, "seed": 5},
])
def test_single_reader_matches_eager(jpeg_dir, options):
    assert_matches_eager(augmented, fresh_reader(jpeg_dir, **options), **EPOCHS)


def test_batch_size_that_does_not_divide_epoch(jpeg_dir):
    assert_matches_eager(augmented, fresh_reader(jpeg_dir, random_shuffle=True, seed=9),
                         batch_size=5, **EPOCHS)


def test_two_readers(jpeg_dir):
    assert_matches_eager(two_readers, fresh_reader(jpeg_dir, random_shuffle=True, seed=1),
                         fresh_reader(jpeg_dir, random_shuffle=True, seed=2), **EPOCHS)


def test_three_readers(jpeg_dir):
    assert_matches_eager(three_readers, fresh_reader(jpeg_dir),
                         fresh_reader(jpeg_dir, random_shuffle=True, seed=7),
                         fresh_reader(jpeg_dir, shard_id=0, num_shards=1), **EPOCHS)


def test_readers_of_different_lengths_zip_as_eager(tmp_path):
    """zip() over readers of different lengths stops at the shortest, having taken one more
    batch from the readers before it; the next epochs go on from there, as eagerly.

    Found in review: it once gave a silently wrong result."""
    from benchmarks._data import make_jpeg_dir

    long_root = make_jpeg_dir(tmp_path / "long", n=13)
    short_root = make_jpeg_dir(tmp_path / "short", n=8)

    def two(a, c):
        for (x, lx), (y, ly) in zip(a.next_epoch(batch_size=3), c.next_epoch(batch_size=3)):
            yield lx * 10 + ly

    def readers():
        return ndd.readers.File(file_root=str(long_root)), \
            ndd.readers.File(file_root=str(short_root))

    def three_epochs(function, readers):
        return [list(function(*readers)) for _ in range(3)]

    assert_matches_eager(three_epochs, Step(two), Fresh(readers), modes=("step",))


def test_break_and_resume_keeps_position(jpeg_dir):
    def consume(function, reader, stop):
        steps = []
        for step in function(reader):
            steps.append(observe(step))
            if len(steps) == stop:
                break
        return steps

    def break_and_resume(function, reader):
        return consume(function, reader, 2) + consume(function, reader, 99)

    assert_matches_eager(break_and_resume, Step(augmented),
                         fresh_reader(jpeg_dir, seed=2, random_shuffle=True), modes=("step",),
                         seed=5, warn=None)


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
    def epoch_then_eager(function, reader):
        first = [observe(step) for step in function(reader)]
        later = [observe(batches) for batches in reader.next_epoch(batch_size=4)]
        return first, later, reader.get_metadata()["epoch_size"]

    assert_matches_eager(epoch_then_eager, Step(augmented),
                         fresh_reader(jpeg_dir, random_shuffle=True, seed=6), modes=("step",),
                         seed=3, warn=None)


def test_rng_reseeded_between_epochs_matches_eager(jpeg_dir):
    def reseeded_epochs(function, reader):
        out = []
        for epoch in range(2):
            ndd.random.set_seed(epoch)  # the user's reseed
            out.append([observe(step) for step in function(reader)])
        return out

    assert_matches_eager(reseeded_epochs, Step(augmented),
                         fresh_reader(jpeg_dir, random_shuffle=True, seed=1), modes=("step",),
                         warn=None)


def test_consumer_draws_from_the_generator_between_steps(jpeg_dir):
    """Mixup: the consumer draws from the default generator at every step; the loop's random
    ops draw after it, as eagerly (runs launched ahead with other states are not used)."""
    def mixup(function, reader):
        steps, lambdas = [], []
        for _ in range(2):
            for step in function(reader):
                lambdas.append(float(np.asarray(ndd.random.uniform(range=[0, 1]))))
                steps.append(observe(step))
        return steps, lambdas

    assert_matches_eager(mixup, Step(augmented),
                         fresh_reader(jpeg_dir, random_shuffle=True, seed=2), modes=("step",),
                         seed=8, warn=None)  # the generator's state after, too


def test_data_dependent_loop_body_runs_eagerly_and_says_so(jpeg_dir):
    def dependent(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            if np.asarray(labels.select(0)).item() == 0:
                yield ndd.decoders.image(jpegs), labels
            else:
                yield ndd.flip(ndd.decoders.image(jpegs)), labels

    with pytest.warns(ndd_trace.NddTraceWarning, match="cannot be compiled whole"):
        assert_matches_eager(dependent, fresh_reader(jpeg_dir), modes=("loop",), warn=None)


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

    assert_matches_eager(gpu_loop, fresh_reader(jpeg_dir, random_shuffle=True, seed=1),
                         **EPOCHS)


def _checkpoint_worker(*args: str) -> list[str]:
    """The batches tests/checkpoint_worker.py saw (a fresh process each)."""
    import subprocess
    import sys

    from conftest import ROOT, subprocess_env

    completed = subprocess.run([sys.executable, ROOT + "/tests/checkpoint_worker.py", *args],
                               capture_output=True, text=True, timeout=300,
                               env=subprocess_env())
    assert completed.returncode == 0, completed.stderr
    return [line.split()[1] for line in completed.stdout.splitlines()]


_CHECKPOINT_STOPS = (2, 7)  # inside the first epoch, and inside the second


@pytest.fixture(scope="module")
def eager_checkpoints(jpeg_dir, tmp_path_factory):
    """An eager save and restore at each stop, and an eager full run: what each mix matches."""
    folder = tmp_path_factory.mktemp("eager_checkpoints")
    runs = {}
    for stop in _CHECKPOINT_STOPS:
        ckpt = str(folder / f"eager_{stop}.ckpt")
        runs[stop] = _checkpoint_worker("eager", "save", str(jpeg_dir), ckpt, str(stop)) + \
            _checkpoint_worker("eager", "resume", str(jpeg_dir), ckpt)
    runs["full"] = _checkpoint_worker("eager", "full", str(jpeg_dir))
    return runs


@pytest.mark.parametrize("saved, restored", [("compiled", "compiled"), ("eager", "compiled"),
                                             ("compiled", "eager")])
def test_checkpoint_mid_epoch_restores_in_new_process(jpeg_dir, tmp_path, saved, restored,
                                                      eager_checkpoints):
    """Saved mid-epoch and restored in a fresh process, in any mix of modes: the batches of
    an eager save and restore (the first epoch after a restore is a full one, from the saved
    position, as eager ndd counts it)."""
    for stop in _CHECKPOINT_STOPS:
        ckpt = str(tmp_path / f"{saved}_{restored}_{stop}.ckpt")
        mixed = _checkpoint_worker(saved, "save", str(jpeg_dir), ckpt, str(stop)) + \
            _checkpoint_worker(restored, "resume", str(jpeg_dir), ckpt)
        assert mixed == eager_checkpoints[stop], (stop, mixed, eager_checkpoints[stop])
    if saved == restored == "compiled":
        assert _checkpoint_worker("compiled", "full", str(jpeg_dir)) == eager_checkpoints["full"]


def test_break_reseed_and_resume_recomputes_read_ahead(jpeg_dir):
    """Batches read ahead before a reseed are recomputed with the new states, not dropped."""
    def break_reseed_resume(function, reader):  # from seed 1
        steps = []
        for step in function(reader):
            steps.append(observe(step))
            break
        ndd.random.set_seed(2)  # the read-ahead batches' states are now stale
        steps += [observe(step) for step in function(reader)]
        ndd.random.set_seed(3)
        steps += [observe(step) for step in function(reader)]
        return steps

    assert_matches_eager(break_reseed_resume, Step(augmented),
                         fresh_reader(jpeg_dir, random_shuffle=True, seed=4), modes=("step",),
                         seed=1, warn=None)


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

    def schedule(function, reader):
        steps = []
        for stop, reseed in plan:
            if reseed is not None:
                ndd.random.set_seed(reseed)
            for index, step in enumerate(function(reader)):
                steps.append(observe(step))
                if stop is not None and index + 1 == stop:
                    break
        return steps

    assert_matches_eager(schedule, Step(loop),
                         fresh_reader(jpeg_dir, random_shuffle=True, seed=seed, **options),
                         modes=("step",), seed=100 + seed, warn=None)


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

    ndd_trace.reset_report()
    with pytest.warns(ndd_trace.NddTraceWarning, match="reader"):
        assert_matches_eager(train_epoch, fresh_reader(jpeg_dir, random_shuffle=True, seed=2),
                             modes=("compiled",), calls=2, seed=4, warn=None)
    report = ndd_trace.report()
    assert any(region.hits for region in report.regions)
    # the fallback reads the reader through a read-ahead pipeline, and says so
    assert sum(report.readers.values()) == 2 and not report.eager_ops


def test_compiled_function_returning_a_generator(jpeg_dir):
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def epoch(reader):
        for _, labels in reader.next_epoch(batch_size=4):
            yield labels

    def batches(reader):
        return epoch(reader)

    def drive(function):
        reader = ndd.readers.File(file_root=str(jpeg_dir))
        return [len(list(function(reader))) for _ in range(2)]

    runs = assert_matches_eager(drive, Step(batches), modes=("step",), seed=None, warn="quiet")
    assert runs["eager"].result == [4, 4]


def test_loop_target_rebound_in_the_body(jpeg_dir):
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def batches(reader):
        for _, labels in reader.next_epoch(batch_size=4):
            labels = labels + 1
            yield labels

    def drive(function):
        reader = ndd.readers.File(file_root=str(jpeg_dir))
        return [np.asarray(ndd.as_tensor(labels)).tolist() for labels in function(reader)]

    assert_matches_eager(drive, Step(batches), modes=("step",), seed=None, warn="quiet")


@pytest.mark.parametrize("kind", ["generator", "function"])
def test_compiled_functools_partial(jpeg_dir, kind):
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    import functools

    def batches(reader, offset):
        for _, labels in reader.next_epoch(batch_size=4):
            yield labels + offset

    def shifted(labels, offset):
        return labels + offset

    def drive(function):
        reader = ndd.readers.File(file_root=str(jpeg_dir))
        if kind == "generator":
            return [np.asarray(ndd.as_tensor(labels)).tolist() for labels in function(reader)]
        return [np.asarray(ndd.as_tensor(function(labels))).tolist()
                for _, labels in reader.next_epoch(batch_size=4)]

    bound = functools.partial(batches if kind == "generator" else shifted, offset=3)
    assert_matches_eager(drive, Step(bound), modes=("step",), seed=None, warn="quiet")


def test_value_sent_into_the_generator(jpeg_dir):
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def batches(reader, log):
        for _, labels in reader.next_epoch(batch_size=4):
            sent = yield labels
            log.append(sent)

    def drive(function):
        log: list = []
        epoch = function(ndd.readers.File(file_root=str(jpeg_dir)), log)
        next(epoch)
        with contextlib.suppress(StopIteration):
            for value in range(10):
                epoch.send(value)
        return log

    runs = assert_matches_eager(drive, Step(batches), modes=("step",), seed=None,
                                warn="ignore")  # (checked mode's notice)
    assert runs["eager"].result == [0, 1, 2, 3]


def test_exception_thrown_into_the_generator(jpeg_dir):
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def batches(reader, log):
        for _, labels in reader.next_epoch(batch_size=4):
            try:
                yield labels
            except ValueError as error:
                log.append(str(error))

    def drive(function):
        log: list = []
        epoch = function(ndd.readers.File(file_root=str(jpeg_dir)), log)
        next(epoch)
        try:
            epoch.throw(ValueError("skip"))
        except ValueError as error:
            log.append(("raised", str(error)))
        return log, len(list(epoch))

    runs = assert_matches_eager(drive, Step(batches), modes=("step",), seed=None,
                                warn="ignore")  # (checked mode's notice)
    assert runs["eager"].result == (["skip"], 2)


@pytest.mark.parametrize("kind", ["generator", "step"])
def test_module_attribute_changed_between_calls(jpeg_dir, kind):
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def resized(jpegs):
        return ndd.resize(ndd.decoders.image(jpegs), size=[training_config.IMAGE_SIZE] * 2)

    def batches(reader):
        for jpegs, _ in reader.next_epoch(batch_size=4):
            yield ndd.resize(ndd.decoders.image(jpegs), size=[training_config.IMAGE_SIZE] * 2)

    def drive(function):
        reader = ndd.readers.File(file_root=str(jpeg_dir))
        widths = []
        try:
            for size in (10, 14):
                training_config.IMAGE_SIZE = size
                epoch = function(reader) if kind == "generator" else (
                    function(jpegs) for jpegs, _ in reader.next_epoch(batch_size=4))
                widths += [np.asarray(ndd.as_tensor(images)).shape[2] for images in epoch]
        finally:
            training_config.IMAGE_SIZE = 12
        return widths

    function = batches if kind == "generator" else resized
    runs = assert_matches_eager(drive, Step(function), modes=("step",), seed=None, warn="quiet")
    assert runs["eager"].result == [10] * 4 + [14] * 4


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

    source = Fresh(lambda: ndd.ExternalSource(_es_items(), cycle=cycle))
    with pytest.warns(ndd_trace.NddTraceWarning, match="DALI's capture mode"):
        runs = assert_matches_eager(captured_loop, source, modes=("loop",), calls=3, seed=3,
                                    warn=None)
    assert ndd_trace.explain(runs["loop"].function).path == "DALI's capture mode"


def test_external_source_zipped_with_reader(jpeg_dir):
    def eager_loop(reader, source):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            yield ndd.resize(ndd.decoders.image(jpegs), size=[8, 8]) + source(batch_size=4)

    def compiled_loop(reader, source):
        for (jpegs, labels), extra in zip(reader.next_epoch(batch_size=4),
                                           source.captured(batch_size=4)):
            yield ndd.resize(ndd.decoders.image(jpegs), size=[8, 8]) + extra

    def run_loop(function):
        reader = file_reader(jpeg_dir)
        source = ndd.ExternalSource(_es_items(count=3), cycle="quiet")
        return [[observe(step) for step in function(reader, source)] for _ in range(2)]

    # two loops written differently (an eager source call, a captured one): the same values
    assert_runs_match(run(run_loop, eager_loop, seed=None),
                      run(run_loop, ndd_trace.compile(compiled_loop), seed=None, warn=None))


def test_compiled_step_inside_a_capture_mode_loop():
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def scale(weights):
        return weights * 2.0

    def drive(step):
        source = ndd.ExternalSource([ndd.as_batch([np.full((2,), i, np.float32)] * 4)
                                     for i in range(3)])
        return [np.asarray(ndd.as_tensor(step(w))) for w in source.captured(batch_size=4)]

    runs = assert_matches_eager(drive, Step(scale), modes=("step",), seed=None, warn="quiet")
    assert len(runs["eager"].result) == 3


def test_external_source_item_prefetched_by_capture_mode(jpeg_dir):
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def batches(reader, source):
        for _, extra in zip(reader.next_epoch(batch_size=4), source.captured(batch_size=4)):
            yield ndd.flip(extra, horizontal=1)

    def drive(function):
        reader = ndd.readers.File(file_root=str(jpeg_dir))
        source = ndd.ExternalSource([ndd.as_batch([np.full((1, 1, 1), i, np.uint8)] * 4,
                                                  layout="HWC") for i in range(20)],
                                    cycle="quiet")
        return [[int(np.asarray(ndd.as_tensor(x)).ravel()[0]) for x in function(reader, source)]
                for _ in range(2)]

    runs = assert_matches_eager(drive, Step(batches), modes=("step",), seed=None, warn="quiet")
    assert runs["eager"].result == [[0, 1, 2, 3], [5, 6, 7, 8]]  # DALI drops item 4, prefetched


def test_two_capture_mode_loops_open_at_once():
    """Reduced from a mismatch the training-loop corpus (tests/test_training_loops.py) found."""
    def batches(source):
        for extra in source.captured(batch_size=2):
            yield ndd.flip(extra, horizontal=1)

    def drive(function):
        sources = [ndd.ExternalSource([ndd.as_batch([np.full((1, 1, 1), i, np.uint8)] * 2,
                                                    layout="HWC") for i in range(3)])
                   for _ in range(2)]
        try:
            return [len(pair) for pair in zip(function(sources[0]), function(sources[1]))]
        except RuntimeError as error:
            return str(error)

    runs = assert_matches_eager(drive, Step(batches), modes=("step",), seed=None, warn="quiet")
    assert runs["eager"].result == "Only one capture-mode loop can be active at a time"
