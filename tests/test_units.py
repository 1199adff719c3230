"""The one unit cache (ndd_trace/units/cache.py): a compiled function's entries, transparent
mode's regions, a per-sample function's variants and reader streams are held alike, and every
built pipeline is in the process's one LRU of live pipelines."""

from __future__ import annotations

import warnings

import numpy as np
from harness import assert_same

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace.units.cache import LIVE_PIPELINES, REGIONS, LivePipelines
from ndd_trace.units.unit import Unit


def _images(value: int) -> ndd.Batch:
    return ndd.as_batch([np.full((8, 8, 3), value, np.uint8)] * 2, layout="HWC")


def _transparent(function, *args):
    with ndd_trace.enabled():
        result = function(*args)
        result.evaluate()
    return result


def _threads() -> int:
    import os

    return len(os.listdir("/proc/self/task"))


def test_region_pipelines_are_bounded_and_freed_least_recently_run_first(monkeypatch):
    """Transparent mode's region pipelines are live pipelines: past the LRU's limit the least
    recently run is freed (its threads too) and built again when run again (found by an
    independent differential fuzzer, ../shared/repros/fuzz/11: one more pipeline and ~5 more
    OS threads per new region, without bound)."""
    from ndd_trace.modes import lazy

    monkeypatch.setattr(LIVE_PIPELINES, "limit", 3)
    monkeypatch.setattr(REGIONS, "free_units", 8)  # (each of the 8 made at its first sighting)
    lazy.reset_report()
    images = ndd.as_batch([np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)] * 2,
                          layout="HWC")

    def step(fill):  # (a fixed argument: a new region per value)
        return ndd.rotate(images, angle=30.0, fill_value=fill)

    counts = []
    for _ in range(2):  # the second pass runs regions whose pipelines were freed
        for i in range(8):
            assert_same(step(0.5 * i), _transparent(step, 0.5 * i))
            counts.append(_threads())
    assert max(counts[4:]) <= counts[3], counts  # no more threads past 3 regions
    report = ndd_trace.report()
    assert len(report.regions) == 8 and report.releases == 16 - 3
    assert "pipelines freed as the least recently run: 13" in str(report)
    assert report.as_dict()["pipelines_released"] == 13
    lazy.reset_report()


def test_a_site_that_keeps_changing_runs_eagerly_past_its_limit(monkeypatch):
    """A call site whose fixed argument changes at every call gets `site_limit` regions, then
    runs eagerly, reported at the user's line: past `cache_limit` a compiled function's calls
    make no more pipelines or threads (found by an independent differential fuzzer,
    ../shared/repros/fuzz/11: a recompilation storm grew them without bound)."""
    from ndd_trace.modes import lazy

    monkeypatch.setattr(REGIONS, "site_limit", 4)
    lazy.reset_report()
    # a copy: user data as it is would run its op at the call, as a region of its own
    images = ndd.batch([np.zeros((16, 16, 3), np.uint8)] * 2, layout="HWC")

    def step(images, fill):  # (a fixed argument: a new region per value)
        return ndd.rotate(ndd.flip(images, horizontal=1), angle=30.0, fill_value=fill)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ndd_trace.NddTraceWarning)
        compiled = ndd.compile(step, cache_limit=2)
        counts = []
        for i in range(12):  # past cache_limit: transparent mode, a new region per value
            assert_same(step(images, 0.25 * i), compiled(images, 0.25 * i))
            counts.append(_threads())
    assert max(counts[6:]) <= counts[5], counts  # 2 entries + 4 regions, then no more
    report = ndd_trace.report()
    assert len(report.regions) == 4
    (chain, reason, where), count = next(iter(report.eager_ops.items()))
    assert chain == "flip[cpu] -> rotate[cpu]" and count == 12 - 2 - 4
    assert "keep changing" in reason and where.endswith(f"test_units.py:"
                                                  f"{step.__code__.co_firstlineno + 1}")
    lazy.reset_report()


def test_compiled_functions_past_the_live_limit_free_their_pipelines_and_rebuild(monkeypatch):
    """Past the LRU's limit, the least recently run entry's pipeline is freed; calling it again
    builds it again, with eager's values."""
    monkeypatch.setattr(LIVE_PIPELINES, "limit", 2)
    LIVE_PIPELINES.clear()

    def make(angle):
        def rotated(images):
            return ndd.rotate(ndd.flip(images, horizontal=1), angle=angle, fill_value=0)
        return rotated

    eager = [make(angle) for angle in (10.0, 20.0, 30.0)]
    compiled = [ndd_trace.compile(function) for function in eager]
    for _ in range(2):
        for plain, fast in zip(eager, compiled):
            assert_same(plain(_images(3)), fast(_images(3)))
    assert LIVE_PIPELINES.releases >= 3  # each run past the third freed the oldest
    builds = [fast.entries[0].executable.builds for fast in compiled]
    assert all(count == 2 for count in builds), builds
    LIVE_PIPELINES.clear()


def test_per_sample_variants_are_live_pipelines_too(monkeypatch):
    """A per-sample function's variant runs an Executable made by units/build.py: it joins the
    one LRU of live pipelines, is freed past its limit, and is built again when called again."""
    monkeypatch.setattr(LIVE_PIPELINES, "limit", 1)
    LIVE_PIPELINES.clear()

    def make(threshold):
        def shrink(image):
            if image.shape[0] > threshold:
                return ndd.resize(image, size=[4, 4])
            return ndd.flip(image, horizontal=1)
        return shrink

    images = ndd.as_batch([np.full((8, 8, 3), 1, np.uint8), np.full((5, 6, 3), 2, np.uint8)],
                          layout="HWC")
    eager = [make(threshold) for threshold in (6, 9)]
    compiled = [ndd_trace.compile(function, per_sample=True) for function in eager]
    for _ in range(2):
        for plain, fast in zip(eager, compiled):
            expected = ndd.as_batch([plain(sample) for sample in images])
            assert_same(expected, fast(images))
    assert LIVE_PIPELINES.releases >= 3
    assert all(fast.builds == 1 for fast in compiled)  # (freed and built again: one variant)
    LIVE_PIPELINES.clear()


def test_a_miss_builds_its_key_once(monkeypatch):
    """The call's key is made once on a miss (again only where the guards' plan changed);
    a hit through the fast guard makes none."""
    from ndd_trace.tracing import guards

    made = []
    build_key = guards.build_key
    monkeypatch.setattr(guards, "build_key", lambda *a, **k: made.append(1) or build_key(*a, **k))

    def flipped(images):
        return ndd.flip(images, horizontal=1)

    compiled = ndd_trace.compile(flipped)
    assert_same(flipped(_images(1)), compiled(_images(1)))
    assert len(made) == 1
    assert_same(flipped(_images(2)), compiled(_images(2)))
    assert len(made) == 1


def test_every_mode_holds_its_units_in_a_unit_cache():
    """A compiled function's entries and a per-sample function's variants: one miss explanation
    (`last_miss_reason`), the same counters (`cache_info()`); test_architecture.py checks that
    both are held in a UnitCache."""
    def brighten(images, factor):
        return ndd.brightness(images, brightness=factor)

    compiled = ndd_trace.compile(brighten)
    per_sample = ndd_trace.compile(brighten, per_sample=True)
    for function in (compiled, per_sample):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for factor in (1.0, 1.0, 2.0):
                assert_same(brighten(_images(5), factor), function(_images(5), factor))
        info = function.cache_info()
        assert (info.hits, info.misses, info.traces) == (1, 2, 2), (function, info)
        assert "factor" in function.last_miss_reason and "->" in function.last_miss_reason


def test_every_generated_pipeline_and_its_graph_are_written_to_the_debug_dir(tmp_path,
                                                                              monkeypatch):
    """NDD_TRACE_DEBUG_DIR=folder: each generated pipeline's source lands there, whole, and is
    the code that runs (`entry.lowered.source`), beside the graph it was generated from
    (transparent mode's regions too)."""
    monkeypatch.setenv("NDD_TRACE_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.delenv("NDD_TRACE_DUMP", raising=False)

    def mirrored(images):
        return ndd.flip(images, horizontal=1)

    compiled = ndd_trace.compile(mirrored)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the current name: no deprecation)
        assert_same(mirrored(_images(2)), compiled(_images(2)))
    written = sorted((tmp_path / "debug").iterdir())
    assert [path.name.split(".", 1)[1] for path in written] == ["graph.txt", "py"], written
    graph, source = written
    assert "mirrored" in source.name and graph.name == source.stem + ".graph.txt"
    assert source.read_text() == compiled.entries[0].lowered.source
    text = graph.read_text()
    assert text.startswith("graph mirrored") and "= flip[cpu](in0, horizontal=1)" in text
    assert not [path for path in (tmp_path / "debug").iterdir() if path.name.startswith(".")]
    ndd_trace.reset()  # (a region of this op may be held from an earlier test)
    with ndd_trace.enabled():  # a transparent-mode region is a generated pipeline too
        np.asarray(mirrored(_images(3)).torch())
    assert len(list((tmp_path / "debug").iterdir())) == 4


def test_ndd_trace_dump_still_works_and_says_once_that_it_is_deprecated(tmp_path, monkeypatch):
    """NDD_TRACE_DUMP, the old name, writes to its folder for one more release, with a
    FutureWarning once a process at the user's line; NDD_TRACE_DEBUG_DIR wins where both are
    set."""
    from ndd_trace.core import process_state

    monkeypatch.setattr(process_state, "deprecations_warned", set())
    monkeypatch.delenv("NDD_TRACE_DEBUG_DIR", raising=False)
    monkeypatch.setenv("NDD_TRACE_DUMP", str(tmp_path / "old"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for factor in (1.5, 2.5):
            brighter = ndd_trace.compile(lambda images: ndd.brightness(images, brightness=2))
            brighter(_images(factor)).evaluate()
    said = [w for w in record if issubclass(w.category, FutureWarning)]
    assert len(said) == 1, [str(w.message) for w in record]
    assert "NDD_TRACE_DUMP is deprecated" in str(said[0].message)
    assert f"set NDD_TRACE_DEBUG_DIR={str(tmp_path / 'old')!r} instead" in str(said[0].message)
    assert said[0].filename == __file__
    assert len(list((tmp_path / "old").glob("*.py"))) == 2
    monkeypatch.setattr(process_state, "deprecations_warned", set())
    monkeypatch.setenv("NDD_TRACE_DEBUG_DIR", str(tmp_path / "new"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ndd_trace.compile(lambda images: ndd.flip(images, vertical=1))(_images(1)).evaluate()
    assert ["ignored: NDD_TRACE_DEBUG_DIR=" in str(w.message) for w in record] == [True]
    assert len(list((tmp_path / "new").glob("*.py"))) == 1
    assert len(list((tmp_path / "old").glob("*.py"))) == 2


def test_reset_forgets_everything_compiled(recwarn):
    """ndd_trace.reset(), as torch.compiler.reset(): compiled and per-sample functions trace
    again at their next call, transparent mode's report starts empty."""
    def brighter(images):
        return ndd.brightness(images, brightness=1.5)

    compiled = ndd_trace.compile(brighter)
    per_sample = ndd_trace.compile(brighter, per_sample=True)
    for function in (compiled, per_sample):
        assert_same(brighter(_images(4)), function(_images(4)))
    with ndd_trace.enabled():
        np.asarray(brighter(_images(4)).torch())
    assert ndd_trace.report().regions
    ndd_trace.reset()
    assert compiled.cache_info().entries == 0 and per_sample.cache_info().entries == 0
    assert not ndd_trace.report().regions
    for function in (compiled, per_sample):
        assert_same(brighter(_images(4)), function(_images(4)))
        assert function.cache_info().traces == 1


def test_a_new_key_is_made_once_its_eager_calls_took_what_making_one_costs(monkeypatch):
    """The ski-rental rule (units/cache.Sightings): a key's calls run eagerly, each counted as
    the period between calls, until they have taken what making a unit costs; before a cost is
    measured, at the second call; a key never seen again costs nothing more."""
    from ndd_trace.units import cache

    now = [0.0]
    monkeypatch.setattr(cache.time, "perf_counter", lambda: now[0])
    sightings = cache.Sightings()
    assert sightings.runs_eagerly(("a",)) and not sightings.runs_eagerly(("a",))  # no cost yet
    sightings.made(0.05)  # making a unit costs 50 ms; calls come every 10 ms
    for _ in range(3):
        now[0] += 0.01
        sightings.called()
    eager = 0
    while sightings.runs_eagerly(("b",)):
        eager += 1
        now[0] += 0.01
        sightings.called()
    assert eager == 5  # 5 calls of 10 ms: 50 ms, then made
    assert sightings.runs_eagerly(("b",))  # (made: a new count if asked again)
    assert len(sightings.spent) == 1


def test_what_making_a_unit_cost_reaches_its_sightings_once_at_its_first_build():
    """A compiled function's entry and a transparent region alike hand their cost (making,
    first build included) to their cache's Sightings once, when the first build ends."""
    def flipped(images):
        return ndd.flip(images, horizontal=1)

    compiled = ndd_trace.compile(flipped)
    sightings = compiled._cache.sightings
    assert sightings.cost() is None
    for _ in range(3):
        assert_same(flipped(_images(3)), compiled(_images(3)))
    (entry,) = compiled._cache.units.values()
    assert sightings.cost() == entry.make_s + entry.executable.backoff.build_s
    assert entry.executable.on_first_build is None

    def shifted(images):
        return ndd.flip(images, vertical=1)

    REGIONS.clear()
    _transparent(shifted, _images(4))
    (region,) = REGIONS.units.values()
    assert REGIONS.sightings.cost(region.site) == \
        region.make_s + region.executable.backoff.build_s
    assert REGIONS.sightings.cost() is None


class _Freed(Unit):
    """A unit whose pipeline release is recorded (`pinned`: a reader stream's, never freed)."""

    def __init__(self, name: str, freed: list, pinned: bool = False):
        super().__init__(key=(("unit", name),))
        self.freed = freed
        self.pinned = pinned

    def release(self) -> bool:
        self.freed.append(self.key[0][1])
        return True


def test_live_pipelines_pass_over_pinned_units_and_free_the_next_least_recently_run():
    """A reader stream counts as a live pipeline and is never freed (its reader's position
    lives in it): past the limit, the least recently run unit that is not pinned goes, and the
    pinned one keeps its place."""
    freed: list = []
    live = LivePipelines(2)
    stream, a, b, c = (_Freed("stream", freed, pinned=True), _Freed("a", freed),
                       _Freed("b", freed), _Freed("c", freed))
    for unit in (stream, a, b):
        live.note_run(unit)
    assert freed == ["a"]
    live.note_run(c)
    assert freed == ["a", "b"]
    assert [held() for held in live._units.values()] == [stream, c]
