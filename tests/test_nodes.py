"""torchdata.nodes: ndd_trace's Loop node resumes mid-epoch exactly, and DALI's own
`ndd.pytorch.nodes` graphs run unchanged under ndd_trace (compiled mappers, transparent mode)."""

from __future__ import annotations

import functools
import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT, subprocess_env
from harness import Fresh, Step, assert_matches_eager, assert_runs_match, assert_same, run, to_numpy

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace import _dali

tn = pytest.importorskip("torchdata.nodes")
torch = pytest.importorskip("torch")
from ndd_trace.nodes import STATE_KEY, Loader, Loop, to_torch  # noqa: E402

BATCH = 3  # 16 photos: epochs of 6 batches, the last one padded


def augmented(reader):
    for jpegs, labels in reader.next_epoch(batch_size=BATCH):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[16, 16])
        angle = ndd.random.uniform(batch_size=images.batch_size, range=[-30, 30])
        yield ndd.rotate(images, angle=angle, keep_size=True), labels


compiled_augmented = ndd.compile(augmented)


def augmented_with(reader, rng):
    for jpegs, labels in reader.next_epoch(batch_size=BATCH):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[16, 16])
        flip = ndd.random.coin_flip(batch_size=images.batch_size, rng=rng)
        yield ndd.flip(images, horizontal=flip), labels


compiled_augmented_with = ndd.compile(augmented_with)

MODES = {
    "eager": {"function": augmented},
    "compiled": {"function": compiled_augmented},
    "transparent": {"function": augmented, "transparent": True},
}


def _reader(jpeg_dir, **kwargs):
    return ndd.readers.File(file_root=str(jpeg_dir), random_shuffle=True, seed=7, **kwargs)


def _run(make_loader, epochs, stop=None, state=None):
    """Items of `epochs` epochs (numpy), an epoch's end marked "|"; with `stop`, the items up
    to there and the loader's state then."""
    ndd.random.set_seed(11)  # (a run's start, as a trainer's; compared by assert_same)
    loader = make_loader()
    if state is not None:
        loader.load_state_dict(state)
    items: list = []
    try:
        for _ in range(epochs):
            for item in loader:
                items.append(to_numpy(item))
                if stop is not None and sum(i != "|" for i in items) == stop:
                    return items, loader.state_dict()
            items.append("|")
        return items, None
    finally:
        if isinstance(loader.root, Loop):
            loader.root.close()
        gc.collect()  # torchdata's Loader is a reference cycle: end its epochs now


def _joined(done, rest):
    """A run saved at `done`'s end and resumed as `rest`: one run, its epochs marked (a state
    saved at an epoch's last item resumes with the next epoch, as torchdata's Loader does)."""
    if done and done[-1] != "|" and sum(i != "|" for i in done) % 6 == 0:
        done = [*done, "|"]
    return done + rest


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("stop", [1, 4, 6, 8])
def test_loop_resumes_mid_epoch_exactly(jpeg_dir, mode, stop):
    """Saved after `stop` items, restored into a new reader and node: the rest of the run is
    the uninterrupted run's, bit for bit (6 = at an epoch's end; 8 = in the second epoch)."""
    options = dict(MODES[mode])
    function = options.pop("function")

    def make():
        return tn.Loader(Loop(function, _reader(jpeg_dir), **options))

    full, _ = _run(make, 3)
    done, state = _run(make, 3, stop=stop)
    rest, _ = _run(make, 3 - stop // 6, state=state)
    assert_same(full, _joined(done, rest))


def test_loop_matches_plain_iteration(jpeg_dir):
    """Through a Loader, a compiled loop gives what calling the generator eagerly gives."""
    def plainly(reader):
        return [item for _ in range(2) for item in augmented(reader)]

    def through_a_loader(reader):
        loader = tn.Loader(Loop(compiled_augmented, reader))
        try:
            return [item for _ in range(2) for item in loader]
        finally:
            loader.root.close()
            gc.collect()

    reader = Fresh(lambda: _reader(jpeg_dir))
    assert_runs_match(run(plainly, reader, seed=11),
                      run(through_a_loader, reader, seed=11, warn=None))


# an eager reader epoch left mid-epoch in the Prefetcher's (ended) thread is finalized in this
# one, and DALI's EvalContext, entered in that thread, complains ("Exception ignored")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("function", [augmented_with, compiled_augmented_with])
def test_loop_in_a_prefetcher_thread_with_its_own_rng(jpeg_dir, function):
    """tn.Prefetcher pulls in a thread of its own; an RNG among the arguments is saved too."""
    def make():
        rng = ndd.random.RNG(seed=5)
        return tn.Loader(tn.Prefetcher(Loop(function, _reader(jpeg_dir), rng), 2))

    full, _ = _run(make, 2)
    done, state = _run(make, 2, stop=3)
    rest, _ = _run(make, 2, state=state)
    assert_same(full, _joined(done, rest))


def test_loop_state_round_trips_before_pulling(jpeg_dir):
    make = lambda: Loop(compiled_augmented, _reader(jpeg_dir))  # noqa: E731
    node = make()
    node.reset()
    first = node.state_dict()
    assert first[STATE_KEY] == 1 and first["readers"][0]["state"] is None
    for _ in range(2):
        node.next()
    state = node.state_dict()
    assert state["step"] == 2 and state["readers"][0]["batches_left"] == 4
    restored = make()
    restored.reset(state)
    assert restored.state_dict() == state  # nothing read yet: the state given
    node.close()
    restored.close()


def test_loop_resumes_in_a_new_process(jpeg_dir, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(f"""\
        import hashlib, json, sys
        import numpy as np
        import nvidia.dali.experimental.dynamic as ndd
        import torchdata.nodes as tn
        import ndd_trace
        from ndd_trace.nodes import Loop

        @ndd.compile
        def augmented(reader):
            for jpegs, labels in reader.next_epoch(batch_size={BATCH}):
                images = ndd.resize(ndd.decoders.image(jpegs), size=[16, 16])
                angle = ndd.random.uniform(batch_size=images.batch_size, range=[-30, 30])
                yield ndd.rotate(images, angle=angle, keep_size=True), labels

        mode, path = sys.argv[1], sys.argv[2]
        ndd.random.set_seed(11)
        reader = ndd.readers.File(file_root={str(jpeg_dir)!r}, random_shuffle=True, seed=7)
        loader = tn.Loader(Loop(augmented, reader))
        if mode == "resume":
            loader.load_state_dict(json.load(open(path)))
        step = 0
        for epoch in range(2):
            for images, labels in loader:
                data = np.asarray(ndd.as_tensor(images)).tobytes()
                print(hashlib.sha256(data).hexdigest()[:16], flush=True)
                step += 1
                if mode == "save" and step == 4:
                    json.dump(loader.state_dict(), open(path, "w"))
                    sys.exit(0)
            if mode == "resume":
                break
        """))

    def worker(*args):
        completed = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                                   text=True, timeout=300, env=subprocess_env(), cwd=ROOT)
        assert completed.returncode == 0, completed.stderr[-3000:]
        return completed.stdout.split()

    state = str(tmp_path / "state.json")
    full = worker("full", state)
    saved = worker("save", state)
    resumed = worker("resume", state)
    assert len(full) == 12 and saved == full[:4] and resumed == full[4:6]


def test_loop_errors(jpeg_dir):
    with pytest.raises(ValueError, match="no ndd reader among the arguments of 'augmented'"):
        Loop(augmented, 3)
    with pytest.raises(TypeError, match="`readers` must hold ndd readers"):
        Loop(augmented, _reader(jpeg_dir), readers=["x"])
    reader = _reader(jpeg_dir)
    with pytest.raises(ValueError, match="already belongs to another"):
        Loop(augmented, reader), Loop(augmented, reader)
    used = _reader(jpeg_dir, enable_checkpointing=True)
    next(iter(used.next_epoch(batch_size=BATCH)))
    state = Loop(augmented, _reader(jpeg_dir)).state_dict()
    with pytest.raises(RuntimeError, match="has read already; a saved state restores into a "
                                           "reader that has not read yet"):
        Loop(augmented, used).reset(state)
    plain = _reader(jpeg_dir)
    next(iter(plain.next_epoch(batch_size=BATCH)))
    with pytest.raises(RuntimeError, match="initialized with checkpointing disabled"):
        Loop(augmented, plain)  # DALI's own error: it read without checkpointing
    gc.collect()


def test_loop_without_checkpointing(jpeg_dir):
    """checkpointing=False: the readers stream (as without a node), tn.Prefetcher's snapshots
    work, and a state is refused on restore."""
    reader = _reader(jpeg_dir)
    loader = tn.Loader(tn.Prefetcher(Loop(augmented, reader, checkpointing=False), 2))
    assert len([to_numpy(item) for item in loader]) == 6
    assert not _dali.reader_checkpointing(reader)
    state = Loop(augmented, _reader(jpeg_dir), checkpointing=False).state_dict()
    assert state["readers"] is None
    with pytest.raises(ValueError, match="checkpointing=False saves no reader positions"):
        Loop(augmented, _reader(jpeg_dir), checkpointing=False).reset(state)


def test_loop_refuses_a_state_lost_by_dalis_nodes(jpeg_dir):
    """DALI's ToTorch saves no state of its source: restoring through it is refused clearly."""
    from nvidia.dali.experimental.dynamic.pytorch.nodes import ToTorch

    def named(reader):
        for images, labels in augmented(reader):
            yield {"images": images, "labels": labels}

    loader = tn.Loader(ToTorch(Loop(named, _reader(jpeg_dir))))
    next(iter(loader))
    state = loader.state_dict()
    restored = tn.Loader(ToTorch(Loop(named, _reader(jpeg_dir))))
    restored.load_state_dict(state)
    with pytest.raises(ValueError, match="not a Loop's state.*DALI's DictMapper and ToTorch "
                                         "save none"):
        iter(restored)
    gc.collect()


def test_loader_length(jpeg_dir):
    """Told its length, a Loader has len() (a trainer then fetches nothing ahead)."""
    assert len(Loader(Loop(augmented, _reader(jpeg_dir)), length=6)) == 6
    with pytest.raises(TypeError, match="was not given a length"):
        len(Loader(Loop(augmented, _reader(jpeg_dir))))
    with pytest.raises(ValueError, match="`length` must be a positive int"):
        Loader(Loop(augmented, _reader(jpeg_dir)), length=0)


def test_to_torch():
    uniform = ndd.as_batch([np.full((2, 3), i, np.uint8) for i in range(4)])
    out = to_torch({"a": (uniform, 3), "b": [ndd.as_tensor(np.ones(2))]})
    assert isinstance(out["a"][0], torch.Tensor) and out["a"][1] == 3
    assert out["a"][0].shape == (4, 2, 3) and int(out["a"][0][3, 1, 2]) == 3
    assert out["b"][0].tolist() == [1.0, 1.0]


# -- DALI's own nodes under ndd_trace ------------------------------------------------------------

def _decode(jpegs):
    images = ndd.resize(ndd.decoders.image(jpegs), size=[24, 20])
    flip = ndd.random.coin_flip(batch_size=images.batch_size)
    return ndd.crop_mirror_normalize(images, mirror=flip, mean=[120.0], std=[50.0])


def _decode_with(jpegs, rng):
    images = ndd.resize(ndd.decoders.image(jpegs), size=[24, 20])
    flip = ndd.random.coin_flip(batch_size=images.batch_size, rng=rng)
    return ndd.crop_mirror_normalize(images, mirror=flip, mean=[120.0], std=[50.0])


def _dali_graph(jpeg_dir, mapper, prefetch=False):
    from nvidia.dali.experimental.dynamic.pytorch import nodes

    node = nodes.Reader(ndd.readers.File, batch_size=4, file_root=str(jpeg_dir),
                        random_shuffle=True, seed=3)
    node = nodes.ToTorch(nodes.DictMapper(node, mapper))
    return tn.Loader(tn.Prefetcher(node, 2) if prefetch else node)


def _epochs(loader, epochs=2):
    return [[tensor.numpy().copy() for tensor in item] for _ in range(epochs) for item in loader]


def test_dali_nodes_with_a_compiled_mapper(jpeg_dir):
    def epochs(decode):
        return _epochs(_dali_graph(jpeg_dir, decode))

    runs = assert_matches_eager(epochs, Step(_decode), modes=("step",), seed=2, warn=None)
    assert len(runs["eager"].result) == 8
    compiled = runs["step"].steps[0]
    assert compiled.cache_info().traces == 1 and compiled.cache_info().fallbacks == 0
    gc.collect()


def test_dali_nodes_under_transparent_mode(jpeg_dir):
    def epochs():
        return _epochs(_dali_graph(jpeg_dir, _decode))

    runs = assert_matches_eager(epochs, modes=("transparent",), seed=2, warn=None)
    assert len(runs["eager"].result) == 8
    report = runs["transparent"].report
    assert report.readers and report.regions  # read ahead, and compiled
    ndd_trace.reset_report()
    gc.collect()


def test_dali_nodes_in_a_prefetcher_thread_with_a_compiled_mapper(jpeg_dir):
    """DictMapper's function runs in tn.Prefetcher's thread: an explicit RNG makes both runs
    draw the same values (each thread has a default generator of its own)."""
    def epochs(decode):
        return _epochs(_dali_graph(jpeg_dir, functools.partial(decode, rng=ndd.random.RNG(seed=9)),
                                   prefetch=True))

    runs = assert_matches_eager(epochs, Step(_decode_with), modes=("step",), seed=None,
                                warn=None)
    assert len(runs["eager"].result) == 8
    gc.collect()
