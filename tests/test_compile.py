"""The compiled function: its decorator forms and options, its cache, graph breaks and what runs
then, explain, outputs and hand-offs (torch, nested compiled functions, pickling)."""

from __future__ import annotations

import functools
import pathlib
import traceback
import warnings

import numpy as np
import pytest
from harness import (Fresh, Step, assert_compiles_exactly, assert_matches_eager, assert_runs_match,
                     assert_same, run)

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace.core.ledger import VerdictKind

SIZE = 12


def test_swallowed_graph_break_is_still_a_break(batch):
    """A graph break caught by the user's own `except BaseException` still breaks the graph
    (the function runs as eager runs it, with a warning), rather than tracing the `except`
    branch as if it were the code (found in review: it once gave a silently wrong result)."""
    def g(x):
        try:
            h = x.shape[0][0]
        except BaseException:  # noqa: BLE001 (what a careless user writes)
            h = 1
        return ndd.crop(x, crop=(h, h))

    with pytest.warns(ndd_trace.NddTraceWarning):
        result = ndd.compile(g)(batch)
    assert_same(g(batch), result)


def test_rng_reseed_break_points_at_the_function(batch):
    def reseeds(x):
        ndd.random.set_seed(1)
        return x + ndd.cast(ndd.random.uniform(batch_size=x.batch_size), dtype=ndd.uint8)

    compiled = ndd.compile(reseeds)
    with pytest.warns(ndd_trace.NddTraceWarning) as caught:
        result = compiled(batch)
    assert caught[0].filename == __file__
    assert_same(reseeds(batch), result)


def test_mixed_batch_sizes_warn_and_fullgraph_raises(images):
    def combine(a, b):
        return ndd.flip(a), ndd.flip(b)

    a = ndd.as_batch(images, layout="HWC")
    b = ndd.as_batch(images[:3], layout="HWC")
    with pytest.warns(ndd_trace.NddTraceWarning, match=r"\[3, 4\]"):
        assert_same(combine(a, b), ndd.compile(combine)(a, b))
    with pytest.raises(ndd_trace.GraphBreakError):
        ndd.compile(combine, fullgraph=True)(a, b)


def test_recompiling_applies_new_options(batch):
    first = ndd.compile(lambda x: ndd.flip(x))
    second = ndd.compile(first, fullgraph=True)
    assert second.fullgraph and second is not first


def test_compile_is_exposed_on_ndd():
    assert ndd.compile is ndd_trace.compile


def test_decorator_forms(batch):
    @ndd.compile
    def plain(x):
        return ndd.flip(x)

    @ndd.compile(fullgraph=True, num_threads=1)
    def configured(x):
        return ndd.flip(x)

    assert_same(plain(batch), configured(batch))
    assert plain.__name__ == "plain"


def test_cache_hits_without_retrace(batch):
    @ndd.compile
    def resize(x):
        return ndd.resize(x, size=[SIZE, SIZE])

    for _ in range(4):
        resize(batch)
    info = resize.cache_info()
    assert (info.hits, info.misses, info.traces, info.entries) == (3, 1, 1, 1)


def test_batch_sizes_reuse_one_trace(images):
    """A smaller batch than the pipeline was built for (an epoch's last) reuses the pipeline; a
    larger one rebuilds it; neither re-traces."""
    @ndd.compile
    def flip(x):
        return ndd.flip(x, vertical=1)

    builds = []
    for n in (2, 1, 4, 3):
        data = ndd.as_batch(images[:n], layout="HWC")
        result = flip(data)
        assert result.batch_size == n
        assert_same(ndd.flip(data, vertical=1), result)
        builds.append(flip.entries[0].executable.builds)
    assert flip.cache_info().traces == 1 and builds == [1, 1, 2, 2], builds


def test_recompilation_storm_warns_once_and_runs_eagerly(batch):
    @ndd.compile(cache_limit=3)
    def scaled(x, k):
        return x * k

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(6):
            assert_same(scaled.__wrapped__(batch, k), scaled(batch, k))
    storm = [w for w in caught if "cache_limit" in str(w.message)]
    assert len(storm) == 1 and "last change: k: 2 -> 3." in str(storm[0].message)
    assert scaled.cache_info().entries == 3 and scaled.cache_info().fallbacks == 3


def test_past_four_variants_a_new_one_runs_eagerly_until_worth_compiling(batch):
    """A function whose variants do not repeat costs eager's time, not a build per call: past
    4 variants, a new variant's calls run eagerly (the same values, no warning) until they have
    taken about as long as compiling a variant did, then it is traced and runs compiled; after
    cache_limit such calls one warning says so."""
    @ndd.compile(cache_limit=6)
    def scaled(x, k):
        return x * k

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(4):
            assert_same(scaled.__wrapped__(batch, k), scaled(batch, k))
        assert not caught and scaled.cache_info()[1:] == (4, 4, 0, 4)
        assert_same(scaled.__wrapped__(batch, 4), scaled(batch, 4))  # not compiled yet: eager
        assert scaled.cache_info()[1:] == (5, 4, 1, 4)
        reason = scaled.ledger.verdicts[-1].reason
        assert reason == "a variant not compiled yet: k: 3 -> 4"
        for calls in range(2, 2000):  # (each eager call counts the time between calls)
            assert_same(scaled.__wrapped__(batch, 4), scaled(batch, 4))
            if scaled.cache_info().traces == 5:
                break
        assert scaled.cache_info().traces == 5 and calls >= 2
        hits = scaled.cache_info().hits
        assert_same(scaled.__wrapped__(batch, 4), scaled(batch, 4))  # then a hit
        assert scaled.cache_info().hits == hits + 1
        for k in range(100, 106):  # new ones: eager
            assert_same(scaled.__wrapped__(batch, k), scaled(batch, k))
    assert [str(w.message).split(" (last change")[0] for w in caught] == [
        "ndd_trace: `test_past_four_variants_a_new_one_runs_eagerly_until_worth_compiling."
        "<locals>.scaled` made 6 calls whose variant was not compiled yet"]
    assert caught[0].filename == __file__
    assert scaled.cache_info().traces == 5


def test_graph_break_runs_eagerly_and_warns_at_user_line(batch):
    def data_dependent(x):
        y = ndd.flip(x)
        if y.shape[0][0] > 10:  # BREAK-LINE
            y = y * 2
        return y

    compiled = ndd.compile(data_dependent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = compiled(batch)
        compiled(batch)
    assert_same(data_dependent(batch), result)
    ours = [w for w in caught if issubclass(w.category, ndd_trace.NddTraceWarning)]
    assert len(ours) == 1
    assert ours[0].filename == __file__
    assert "BREAK-LINE" in pathlib.Path(__file__).read_text().splitlines()[ours[0].lineno - 1]
    explanation = ndd_trace.explain(compiled, batch)
    assert explanation.breaks and ".shape" in explanation.breaks[0].reason
    assert explanation.breaks[0].filename == __file__


def test_fullgraph_raises_graph_break_error(batch):
    @ndd.compile(fullgraph=True)
    def to_numpy(x):
        return np.asarray(ndd.flip(x))

    with pytest.raises(ndd_trace.GraphBreakError) as info:
        to_numpy(batch)
    assert info.value.filename == __file__
    assert "numpy" in info.value.reason
    assert traceback.extract_tb(info.tb)[-1].filename == __file__


def test_random_graph_break_keeps_rng_state_exact(batch):
    def breaks_after_random(x):
        noise = ndd.random.uniform(batch_size=x.batch_size, range=[0, 1])
        np.asarray(ndd.as_tensor(noise))  # forces data: graph break
        return noise

    with pytest.warns(ndd_trace.NddTraceWarning):
        assert_matches_eager(breaks_after_random, batch, modes=("compiled",), seed=3, warn=None)


def test_reader_inside_function_runs_eagerly(jpeg_dir):
    reader = ndd.readers.File(file_root=str(jpeg_dir))

    def read_one():
        for jpegs, labels in reader.next_epoch(batch_size=4):
            return labels

    compiled = ndd.compile(read_one)
    with pytest.warns(ndd_trace.NddTraceWarning, match="reader"):
        labels = compiled()
    assert labels.batch_size == 4


def test_explain_report_and_code(batch):
    @ndd.compile
    def preprocess(x):
        return ndd.flip(ndd.resize(x, size=[8, 8]))

    explanation = ndd_trace.explain(preprocess, batch)
    text = str(explanation)
    assert "fn.resize(" in explanation.code and "fn.flip(" in explanation.code
    assert "test_compile.py:" in explanation.code
    assert "graph preprocess" in text and "guards" in text
    assert explanation.breaks == []
    assert preprocess.cache_info().traces == 0  # explaining does not fill the cache


def test_torch_handoff(batch):
    torch = pytest.importorskip("torch")

    @ndd.compile
    def normalize(x):
        return ndd.crop_mirror_normalize(ndd.resize(x, size=[8, 8]), mean=[0.0], std=[1.0])

    tensor = normalize(batch).torch()
    assert isinstance(tensor, torch.Tensor) and tensor.shape == (4, 3, 8, 8)
    expected = ndd.crop_mirror_normalize(ndd.resize(batch, size=[8, 8]), mean=[0.0], std=[1.0])
    assert torch.equal(tensor, expected.torch())


def test_results_are_lazy_and_ordered(batch):
    @ndd.compile
    def add(x, k):
        return x + k

    first, second = add(batch, 1), add(batch, 2)
    assert_same(batch + 2, second)
    assert_same(batch + 1, first)


def test_nested_compiled_functions_inline(batch):
    @ndd.compile
    def inner(x):
        return ndd.flip(x)

    def outer(x):
        return inner(x) * 2

    assert_compiles_exactly(outer, batch)


@pytest.mark.gpu
def test_gpu_decode_and_torch_stays_on_gpu(jpegs):
    torch = pytest.importorskip("torch")

    def preprocess(data):
        images = ndd.decoders.image(data, device="gpu")
        images = ndd.resize(images, size=[32, 32])
        return ndd.crop_mirror_normalize(images, mean=[0.0], std=[255.0],
                                         mirror=ndd.random.coin_flip(batch_size=8))

    compiled = assert_compiles_exactly(preprocess, jpegs, calls=2)
    result = compiled(jpegs).torch()
    assert result.is_cuda and isinstance(result, torch.Tensor)


@pytest.mark.gpu
def test_gpu_ops_and_transfers(batch):
    def mixed(x):
        y = ndd.flip(x.gpu())
        z = ndd.gaussian_blur(y, window_size=3) * 2
        return z, z.cpu(), ndd.random.uniform(batch_size=x.batch_size, device="gpu")

    assert_compiles_exactly(mixed, batch, calls=2)


def test_unused_calls_on_given_data_raise_as_eagerly_and_unused_draws_still_draw(images):
    """Found by the fuzzer, then by the twenty-eighth session's sweep: eager ndd runs a call
    given data (an argument, user data) at once, so an unused failing call raises at the call;
    such a call keeps the function from being compiled whole. An unused call on an op's result
    is pruned, as deferred mode never runs it; a pruned random call still draws."""
    data = ndd.as_batch([np.ascontiguousarray(i[:6, :11]) for i in images], layout="HWC")

    def unused_calls(x):
        ndd.crop(x, crop=[7, 4])  # larger than the images; result unused
        ndd.random.uniform(batch_size=x.batch_size)  # unused, but draws
        return ndd.flip(x)

    assert_matches_eager(unused_calls, data, modes=("compiled", "transparent"), warn="ignore",
                         raises=True)

    def unused_on_a_result(x):
        y = ndd.flip(x)
        ndd.crop(y, crop=[2, 2])  # on an op's result: never run eagerly, pruned
        ndd.random.uniform(batch_size=x.batch_size)  # unused, but draws
        return y

    compiled = assert_compiles_exactly(unused_on_a_result, data)
    assert "crop" not in compiled.entries[0].lowered.source


def test_external_source_pull_inside_is_a_graph_break(batch):
    source = ndd.ExternalSource([batch, ndd.flip(batch)])

    def pulls():
        return ndd.flip(source())

    compiled = ndd.compile(pulls)
    with pytest.warns(ndd_trace.NddTraceWarning, match="ExternalSource"):
        first = compiled()
    second = compiled()  # eager: the next batch, not a frozen copy of the first
    assert_same(ndd.flip(batch), first)
    assert_same(ndd.flip(ndd.flip(batch)), second)


def test_operator_object_inside_is_a_graph_break(batch):
    from nvidia.dali.experimental.dynamic import _ops

    flip = _ops.Flip(horizontal=1)
    compiled = ndd.compile(lambda x: flip(x))
    with pytest.warns(ndd_trace.NddTraceWarning, match="operator object"):
        result = compiled(batch)
    assert_same(ndd.flip(batch, horizontal=1), result)


def test_graph_break_falls_back_to_transparent_regions(batch):
    """A broken function still runs its ndd calls as cached pipeline regions around the break."""
    def crop_half(x):
        y = ndd.flip(x, horizontal=1) * 2      # region 1
        h, w, _ = y.shape[0]                   # the break: needs data
        return ndd.rotate(ndd.crop(y, crop=(h // 2, w // 2)), angle=10.0)  # region 2

    ndd_trace.reset_report()
    compiled = ndd.compile(crop_half)
    with pytest.warns(ndd_trace.NddTraceWarning, match="transparent mode"):
        results = [compiled(batch) for _ in range(3)]
    for result in results:
        assert_same(crop_half(batch), result)
    report = ndd_trace.report()
    assert report.regions and max(region.hits for region in report.regions) >= 2


def test_fallback_eager_option(batch):
    def needs_data(x):
        return ndd.crop(x, crop=(x.shape[0][0] // 2, 4))

    compiled = ndd.compile(needs_data, fallback="eager")
    with pytest.warns(ndd_trace.NddTraceWarning, match="runs eagerly"):
        result = compiled(batch)
    assert type(result) is ndd.Batch  # plain eager ndd, not a lazy value
    assert_same(needs_data(batch), result)
    with pytest.raises(ValueError, match="fallback"):
        ndd.compile(needs_data, fallback="sometimes")


def test_options_set_after_compiling_take_effect(batch):
    """`fast.cache_limit = 16` and the other options, set on the compiled function, are the
    ones its cache, its trace and its warnings use (each kept in one place)."""
    def needs_data(x):
        return ndd.crop(x, crop=(x.shape[0][0] // 2, 4))

    compiled = ndd.compile(needs_data)
    compiled.cache_limit = 16
    compiled.fallback = "eager"
    assert (compiled.cache_limit, compiled.fallback) == (16, "eager")
    with pytest.warns(ndd_trace.NddTraceWarning, match=r"runs eagerly \(plain ndd"):
        result = compiled(batch)
    assert type(result) is ndd.Batch  # plain eager ndd, not a lazy value
    assert compiled.entries[0].path == "eager"
    assert_same(needs_data(batch), result)
    with pytest.raises(ValueError, match="fallback"):
        compiled.fallback = "sometimes"
    compiled.fullgraph = True
    compiled.cache_clear()
    with pytest.raises(ndd_trace.GraphBreakError):
        compiled(batch)
    compiled.fullgraph = False
    compiled.optimize = True
    assert ndd_trace.explain(compiled, ndd.as_batch(
        [np.zeros((4, 4, 3), np.uint8)] * 2, layout="HWC")).optimize


def test_explain_shows_the_graph_that_runs(batch):
    """The graph explain prints first is the one the pipeline was generated from (after the
    passes); the traced one follows where the passes changed it."""
    def duplicated(x):
        a = ndd.resize(x, size=[8, 8])
        unused = ndd.flip(a, horizontal=1)  # noqa: F841 (dead code: removed)
        b = ndd.resize(x, size=[8, 8])  # the same call: merged with `a`
        return a, b

    explanation = ndd_trace.explain(duplicated, batch)
    running, traced = explanation.graph.split("as traced", 1)
    assert running.count("resize[") == 1 and "flip[" not in running
    assert traced.count("resize[") == 2 and "flip[" in traced
    assert explanation.code.count("fn.resize(") == 1 and "fn.flip(" not in explanation.code


def test_explain_says_what_to_try_for_each_break(batch):
    def needs_shapes(x):
        y = ndd.flip(x, horizontal=1)
        return y * 2 if y.shape[0][0] > 2 else y

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = str(ndd_trace.explain(needs_shapes, batch))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines)
              if line.startswith("    - ") and "reads `.shape`" in line)
    assert lines[at + 1].strip().startswith("try: compute what needs the data's shapes outside")


def test_every_break_the_tracer_raises_has_a_fix():
    """The fix table covers each reason the tracer and its traced values give (their
    `graph_break(...)` texts)."""
    import ast

    from ndd_trace.tracing import trace, values

    reasons = []
    for module in (trace, values):
        for node in ast.walk(ast.parse(pathlib.Path(module.__file__).read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                    "graph_break", "GraphBreakSignal"):
                first = node.args[0]
                text = first.value if isinstance(first, ast.Constant) else "".join(
                    part.value if isinstance(part, ast.Constant) else "X"
                    for part in getattr(first, "values", []))
                reasons.append(text)
    assert len(reasons) > 15
    own_fix = ("pass", "write the loop", "make the function", "outside the compiled", "use the")
    missing = [r for r in reasons if r and trace.GraphBreakRecord(r, None).fix is None
               and not any(words in r for words in own_fix)]
    assert not missing, f"breaks with no fix in trace._FIXES: {missing}"


def test_explain_and_cache_info_read_the_ledger(batch):
    """Each call not run as compiled is recorded once, with its reason and the user's line, and
    explain, cache_info() and the warning all say the same (issue 32: one verdict, one ledger)."""
    import warnings as _warnings

    @ndd.compile
    def shaped(x):
        if x.shape[0][0] > 0:  # reads a shape: a graph break
            return x * 2
        return x

    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        for _ in range(3):
            assert_same(shaped.__wrapped__(batch), shaped(batch))
    info = shaped.cache_info()
    assert info.fallbacks == 3 == len(shaped.ledger.verdicts)
    verdict = shaped.ledger.verdicts[-1]
    assert verdict.kind is VerdictKind.GRAPH_BREAK and verdict.loc is not None
    assert verdict.reason.startswith("graph break:")  # (the text the user reads)
    assert [str(w.filename) for w in caught if "cannot be compiled whole" in str(w.message)] \
        == [verdict.loc.filename]
    text = str(ndd_trace.explain(shaped, batch))
    assert "calls not run as compiled (latest 3)" in text and verdict.reason in text


def test_output_structures_come_back_as_eager_returns_them(batch):
    """OrderedDicts, dataclasses (frozen too), namedtuples, deques and list subclasses come back
    with eager's types and key order (issue 35: a dataclass held the trace's proxies, an
    OrderedDict came back a dict)."""
    import collections
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Sample:
        image: object
        label: int
        extra: list

    class Images(list):
        pass

    Pair = collections.namedtuple("Pair", "left right")

    def structured(x):
        flipped = ndd.flip(x, horizontal=1)
        return {
            "z": Sample(flipped, 3, [x * 2, "text"]),
            "a": collections.OrderedDict([("second", x), ("first", flipped)]),
            "pair": Pair(flipped, (x,)),
            "queue": collections.deque([x]),
            "images": Images([flipped, None]),
        }

    compiled = assert_compiles_exactly(structured, batch, calls=2)
    eager, result = structured(batch), compiled(batch)
    assert list(result) == list(eager) and type(result["a"]) is collections.OrderedDict
    assert list(result["a"]) == ["second", "first"]
    assert type(result["z"]) is type(eager["z"]) and result["z"].label == 3
    assert type(result["pair"]) is type(eager["pair"])
    assert type(result["queue"]) is collections.deque
    assert type(result["images"]) is type(eager["images"])
    assert_same(eager["z"].image, result["z"].image)
    assert_same(eager["z"].extra[0], result["z"].extra[0])


def test_compiled_functions_pickle_by_reference_into_spawn_workers():
    """A compiled function pickles as a function does, by its module and name (issue 35: it
    raised PicklingError, so spawn DataLoader workers and multiprocessing could not use it)."""
    import multiprocessing
    import pickle

    import pickled_worker

    assert pickle.loads(pickle.dumps(pickled_worker.flipped)) is pickled_worker.flipped
    values = [np.arange(12).reshape(2, 2, 3)]
    eager, _ = pickled_worker.run_in_worker(pickled_worker.flipped.__wrapped__, values)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result, traces = pool.apply(pickled_worker.run_in_worker, (pickled_worker.flipped, values))
    assert result == eager and traces == 1
    # `mirrored = ndd.compile(_mirrored)`: by the name it is bound to, as `mirrored = _mirrored`
    # pickles its function (found by a new-user probe: PicklingError)
    assert pickle.loads(pickle.dumps(pickled_worker.mirrored)) is pickled_worker.mirrored
    eager, _ = pickled_worker.run_in_worker(pickled_worker._mirrored, values)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result, _ = pool.apply(pickled_worker.run_in_worker, (pickled_worker.mirrored, values))
    assert result == eager

    local = ndd.compile(lambda x: x)
    with pytest.raises(pickle.PicklingError, match="at module level"):
        pickle.dumps(local)


def test_an_ordered_dict_reordered_comes_back_in_its_order(batch):
    """An OrderedDict whose keys were moved (`move_to_end`) comes back in its own order (found
    by a new-user probe: optree read the order of the dict underneath, the insertion order)."""
    import collections

    def named(x):
        out = collections.OrderedDict()
        out["flipped"] = ndd.flip(x, horizontal=1)
        out["doubled"] = x * 2
        out["original"] = x
        out.move_to_end("flipped")
        out.move_to_end("original", last=False)
        return out

    assert_compiles_exactly(named, batch, calls=2)


class _Sample(tuple):
    """A tuple subclass whose constructor takes its fields (not one iterable)."""

    def __new__(cls, image, label):
        return super().__new__(cls, (image, label))


def _counted_and_sampled(x):
    import collections
    flipped = ndd.flip(x, horizontal=1)
    return collections.Counter(["cat", "cat", "dog"]), _Sample(flipped, 3)


def test_a_counter_and_a_tuple_subclass_come_back_as_eager_returns_them(batch):
    """Found by a new-user probe: a returned Counter came back counting its (key, count) pairs,
    and a tuple subclass whose `__new__` takes its fields raised a TypeError."""
    compiled = assert_compiles_exactly(_counted_and_sampled, batch, calls=2)
    counter, sample = compiled(batch)
    assert counter == {"cat": 2, "dog": 1} and type(sample) is _Sample and sample[1] == 3


_MEAN = np.array([0.5, 0.25])


def _with_weights(x):
    return ndd.flip(x, horizontal=1), np.ones(2), _MEAN


def _weights_scaled_in_place(step, x):
    seen = []
    for _ in range(3):
        _, weights, mean = step(x)
        weights *= 0.5  # the caller's own array, changed in place
        seen.append((weights.copy(), mean is _MEAN))
    return seen


def test_a_numpy_array_the_function_makes_is_a_new_one_at_each_call(batch):
    """Found by a new-user probe: a returned numpy array was one object at every call, so a
    caller's in-place change built up (0.125 after three calls; eager 0.5); a global array
    returned stays eager's own object."""
    assert_matches_eager(_weights_scaled_in_place, Step(_with_weights), batch, modes=("step",))


def _described(x):
    flipped = ndd.flip(x, horizontal=1)
    return flipped, f"{flipped}", str(flipped), repr(x * 2)


def test_a_traced_value_formatted_as_text_is_a_graph_break(batch):
    """Found by a new-user probe: `f"{y}"` and `str(y)` in a compiled function gave
    `<TracedBatch v1 ...>`, frozen into every call, where eager gives the values' text."""
    assert_matches_eager(_described, batch, modes=("compiled",), calls=2, warn="ignore")


def test_a_result_returned_twice_is_one_object_as_eagerly(batch):
    """`return y, y` (or `{"image": y, "all": [y, x]}`): eager returns one object in both
    places, and so does the compiled function (found by a new-user probe: two Batches)."""
    def twice(x):
        y = ndd.flip(x, horizontal=1)
        return y, y, {"image": y, "all": [y, x, x]}

    assert_compiles_exactly(twice, batch, calls=2)


def _aliased(x):
    d = {"image": ndd.flip(x, horizontal=1)}
    return d, [d]


def _aliased_used(step, x):
    d, listed = step(x)
    d["label"] = 3  # (seen through the list too, as one object)
    return d, listed[0] is d, sorted(listed[0])


def test_a_container_returned_in_two_places_is_one_object_as_eagerly(batch):
    """`d = {"image": y}; return d, [d]`: eager returns one dict in both places, so a key added
    through one is seen through the other; a compiled call would make one per place (found by
    the twenty-second session's sweep), so it runs as eager does and says so."""
    with pytest.warns(ndd_trace.NddTraceWarning, match="one container in two places"):
        assert_matches_eager(_aliased_used, Step(_aliased), batch, modes=("step",), warn=None)


class _Counted:
    def __init__(self):
        self.stats = {"calls": 0}

    def __call__(self, x):
        return {"image": ndd.flip(x, horizontal=1), "stats": self.stats}


def test_objects_the_function_was_given_come_back_as_the_very_objects(batch):
    """A dict held by `self` returned (`{"image": y, "stats": self.stats}`) and a list argument
    of Batches returned unchanged come back as the very objects eager returns, at every call
    (found by the twenty-second session's sweep: a copy made at the trace, so writes through
    the result were lost, and its content was the trace's)."""
    counted, compiled = _Counted(), ndd.compile(_Counted.__call__)
    for _ in range(3):
        out = compiled(counted, batch)
        assert out["stats"] is counted.stats
        out["stats"]["calls"] += 1
    assert counted.stats == {"calls": 3}

    def passed_on(xs):
        return [ndd.flip(x, horizontal=1) for x in xs], xs

    step = ndd.compile(passed_on)
    for _ in range(2):
        given = [batch]
        assert step(given)[1] is given


def _doubled(x):
    return ndd.flip(x, horizontal=1) * 2


def test_a_result_not_read_yet_deep_copies_as_eagerly(batch):
    """`copy.deepcopy` of a compiled step's result not read yet raises eager's TypeError (found
    by a new-user probe: a RecursionError, as the copy walked into the pipeline run). Its text
    is not compared: eager's depends on whether its own run has finished by then (the pending
    invocation's lock, or the TensorList it left), which a loaded machine changes."""
    import copy

    def logged(step, x):
        out = step(x)
        try:
            copy.deepcopy(out)
        except TypeError:
            return "TypeError", out
        return "copied", out

    assert_matches_eager(logged, Step(_doubled), batch, modes=("step",))


def test_explain_says_how_the_next_call_runs_past_four_variants(batch, monkeypatch):
    """explain's "runs as" is what the call with these arguments does: eagerly for a new
    variant past the first four (found by the session's differential sweep: it said "one
    pipeline"), compiled once that variant is held, and past cache_limit its fallback."""
    from ndd_trace.units import cache

    # a variant is made once its eager calls took 5 ms (not a build's measured seconds)
    monkeypatch.setattr(cache.Sightings, "cost", lambda self, site=None: 0.005)

    @ndd.compile(cache_limit=5)
    def spin(images, angle):
        return ndd.rotate(images, angle=angle, fill_value=0)

    for angle in (1, 2, 3, 4):
        spin(batch, angle)
    assert "runs as: eager for this call: a variant not compiled yet" in str(
        ndd_trace.explain(spin, batch, 5))
    traces = spin.cache_info().traces
    for _ in range(100):  # (compiled once its eager calls took what compiling one did)
        spin(batch, 5)
        if spin.cache_info().traces > traces:
            break
    assert "runs as: one pipeline" in str(ndd_trace.explain(spin, batch, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spin(batch, 6)  # (five variants traced: cache_limit's)
    assert spin.cache_info().traces == traces + 1 == 5
    assert "runs as: transparent mode: past cache_limit (5)" in str(
        ndd_trace.explain(spin, batch, 6))


# -- a compiled function is a function to Python (found by the twenty-second session's sweep of
# object-oriented code) ---------------------------------------------------------------------------

class _Hooked:
    @ndd.compile
    def run(self, x):
        return ndd.flip(x, horizontal=1)


def test_a_compiled_method_binds_to_its_instance_as_a_function_does(batch):
    """`a.run == a.run`, `a.run in hooks`, `hooks.remove(a.run)`, `a.run.__self__` and
    `inspect.ismethod` hold as for a plain method (a bound compiled method was a
    functools.partial: each binding a new object, equal to none), and it runs as eager's."""
    import inspect

    a = _Hooked()
    hooks = [a.run]
    assert a.run == a.run and a.run in hooks and a.run.__self__ is a
    assert inspect.ismethod(a.run) and a.run.__func__ is _Hooked.__dict__["run"]
    hooks.remove(a.run)
    assert hooks == []
    assert_runs_match(run(_Hooked.run.__wrapped__, a, batch, seed=0),
                      run(a.run, batch, seed=0, warn=None))


def test_defaults_set_on_a_compiled_function_are_its_functions(batch):
    """`f.__defaults__ = (6,)` (and `__kwdefaults__`) through the compiled name change what its
    calls bind, as on the plain function (they were kept on the wrapper and ignored)."""
    def resize(x, size=4, *, flip=0):
        return ndd.flip(ndd.resize(x, size=[size, size]), horizontal=flip)

    compiled = ndd.compile(resize)
    assert tuple(compiled(batch).torch().shape)[1:3] == (4, 4)
    compiled.__defaults__ = (6,)
    compiled.__kwdefaults__ = {"flip": 1}
    assert resize.__defaults__ == (6,) and compiled.__kwdefaults__ == {"flip": 1}
    assert_runs_match(run(resize, batch, seed=0), run(compiled, batch, seed=0, warn=None))


# -- a function with `__wrapped__` runs its own code (found by the twenty-third session's sweep:
# its source was read through `__wrapped__`, as inspect.getsource does) --------------------------

_WRAPPER_CALLS: list[str] = []


def _logged(fn):  # a user's logging decorator
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _WRAPPER_CALLS.append(fn.__name__)
        return fn(*args, **kwargs)
    return wrapper


@_logged
def _logged_step(jpegs):
    return ndd.resize(ndd.decoders.image(jpegs), size=[8, 8])


def _evens(fn):  # a generator wrapper that filters and overrides a keyword
    @functools.wraps(fn)
    def wrapper(reader, **kwargs):
        for index, item in enumerate(fn(reader, **{**kwargs, "size": 6})):
            if index % 2 == 0:
                yield item
    return wrapper


@_evens
def _resized_epoch(reader, size=8):
    for jpegs, _ in reader.next_epoch(batch_size=2):
        yield ndd.resize(ndd.decoders.image(jpegs), size=[size, size])


def _unflipped_epoch(reader):
    for jpegs, _ in reader.next_epoch(batch_size=2):
        yield ndd.decoders.image(jpegs)


def _flipped_epoch(reader):
    for jpegs, _ in reader.next_epoch(batch_size=2):
        yield ndd.flip(ndd.decoders.image(jpegs), horizontal=1)


_flipped_epoch.__wrapped__ = _unflipped_epoch  # (as a helper library may leave on a function)


def _all_steps(function, reader):
    return list(function(reader))


def _three_calls(step, jpegs):
    _WRAPPER_CALLS.clear()
    return [step(jpegs) for _ in range(3)], list(_WRAPPER_CALLS)


def test_a_wrapped_function_runs_its_own_code_as_eagerly(jpeg_dir, jpeg_bytes):
    """A step under a user's functools.wraps decorator that logs (its line ran once, at the
    trace), a generator wrapper that filters the wrapped one's batches and overrides a keyword
    (NameError at its first step: the wrapped function's loop ran on the wrapper's names), a
    generator carrying a `__wrapped__` of another (that one's source ran: silently unflipped):
    each gives eager's values and side effects."""
    from reader_steps import file_reader

    assert_matches_eager(_three_calls, Step(_logged_step), ndd.as_batch(jpeg_bytes[:4]),
                         modes=("step",), warn="ignore")
    for generator in (_resized_epoch, _flipped_epoch):
        assert_matches_eager(_all_steps, Step(generator), Fresh(lambda: file_reader(jpeg_dir)),
                             modes=("step",), warn="ignore")
    made = ndd.compile(_flipped_epoch)(file_reader(jpeg_dir))  # named as eager's generator
    assert (made.__name__, repr(made).split(" at ")[0]) == (
        "_flipped_epoch", "<generator object _flipped_epoch")
    made.close()
