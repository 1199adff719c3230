"""The loader verdict: per reader loop, the consumer's wait for data vs its own step.

The two consumers differ by far more than any timing noise: one sleeps 0.4 s a step (the loader,
a few ms, reads and runs ahead meanwhile), the other only converts its batches (it waits for
nothing but data)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
from conftest import subprocess_env
from harness import Fresh, assert_matches_eager

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace.execution import waits

SLEEP = 0.4


def _loop(jpeg_dir):
    @ndd.compile
    def batches(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            images = ndd.resize(ndd.decoders.image(jpegs), size=[32, 32])
            yield ndd.flip(images, horizontal=1), labels

    return batches, ndd.readers.File(file_root=str(jpeg_dir), random_shuffle=True, seed=1)


def _consume(batches, reader, sleep, epochs=1):
    for _ in range(epochs):
        for images, labels in batches(reader):
            images.torch(), labels.torch()  # (the compiled step's outputs: waited for here)
            if sleep:
                time.sleep(sleep)


@pytest.mark.parametrize("sleep, bottleneck", [(0, True), (SLEEP, False)])
def test_verdict_of_a_compiled_loop(jpeg_dir, sleep, bottleneck):
    batches, reader = _loop(jpeg_dir)
    ndd_trace.reset_report()
    _consume(batches, reader, sleep, epochs=2 if sleep == 0 else 1)
    report = ndd_trace.report()
    ndd_trace.reset_report()
    (times,) = report.loops
    assert times.name.endswith("batches") and times.epochs == (2 if sleep == 0 else 1)
    assert times.batches == (7 if sleep == 0 else 3) and times.samples == 4 * times.batches
    assert times.bottleneck is bottleneck, times.lines()
    assert times.mode == "compiled generator" and not times.optimized
    median, p90 = times.spread()
    assert times.verdict().startswith(
        f"data loading is {times.share:.0%} of the step (per step: median {median:.0%}, "
        f"p90 {p90:.0%}): ")
    if bottleneck:  # it only converts its batches: it waits for nothing but data
        # the grade is GRADES' for the share measured (how far past 10% depends on the
        # machine's load: no timed bound here), and the verdict says it
        _, grade, phrase = next(g for g in reversed(waits.GRADES) if times.share >= g[0])
        assert times.grade == grade and grade in ("partial", "severe"), times.lines()
        assert phrase in times.verdict()
        assert f"would make the loop {times.speedup:.2f}x as fast" in times.verdict()
        # a deeper queue first where the waits came in bursts (median under 10%, p90 over)
        bursts = median < waits.BOTTLENECK_SHARE <= p90 and times.share < 0.5
        first = "a deeper queue" if bursts else "`@ndd.compile(optimize=True)`"
        assert times.advice()[0].startswith(first), times.advice()
        assert any(tip.startswith("`@ndd.compile(optimize=True)`") for tip in times.advice())
    else:
        assert times.grade in ("negligible", "minor") and not times.advice()
        assert "the loader is not the bottleneck" in times.verdict()
        assert times.step >= 3 * SLEEP * 0.9  # the sleeps are the consumer's own step
    text = str(report)
    assert text.startswith("ndd_trace report (compiled generator)\n"), text
    assert "reader loops (the consumer's wait for data vs its own step):" in text
    assert f"batches (compiled generator), {times.epochs} epoch(s)" in text
    assert times.verdict() in text and "batches/s" in text and "samples/s" in text
    assert all(f"      try: {tip}" in text for tip in times.advice())
    assert ("compare_with_replay(loop, step) runs the step again" in text) is bottleneck
    entry = report.as_dict()["loops"][0]
    assert entry["bottleneck"] is bottleneck and entry["batches"] == times.batches
    assert entry["grade"] == times.grade and entry["advice"] == times.advice()
    assert entry["wait_share_median"] == round(median, 4) and entry["mode"] == times.mode
    assert len(entry["wait_ms_per_step"]) == times.batches


def test_timing_keeps_results_and_state(jpeg_dir):
    """Timed, a compiled loop still gives eager's batches and RNG state."""
    def augmented(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            images = ndd.resize(ndd.decoders.image(jpegs), size=[16, 16])
            flip = ndd.random.coin_flip(batch_size=images.batch_size)
            yield ndd.flip(images, horizontal=flip), labels

    make = lambda: ndd.readers.File(file_root=str(jpeg_dir), random_shuffle=True, seed=4)  # noqa
    assert_matches_eager(augmented, Fresh(make), modes=("loop",), seed=3, warn=None)


def test_a_reader_loop_inside_a_timed_loop_is_part_of_its_wait(jpeg_dir):
    """A compiled generator whose loop body runs in checked mode opens its reader epoch in
    transparent mode, inside its own `next()`: one loop, the generator's, not two."""
    @ndd.compile
    def checked(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            images = ndd.resize(ndd.decoders.image(jpegs), size=[32, 32])
            if int(np.asarray(labels.select(0))[0]) >= 0:  # Python reads data: checked mode
                images = ndd.flip(images, horizontal=1)
            yield images, labels

    reader = ndd.readers.File(file_root=str(jpeg_dir), random_shuffle=True, seed=1)
    ndd_trace.reset_report()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ndd_trace.NddTraceWarning)
        _consume(checked, reader, 0)
    loops = ndd_trace.report().loops
    ndd_trace.reset_report()
    assert checked.cache_info().fallbacks == 1
    assert [times.name.rsplit(".", 1)[-1] for times in loops] == ["checked"]


def test_too_few_steps_and_reset():
    times = waits.LoopTimes("loop", "x.py:1")
    times._add(1.0, 0.5, 4)  # the first batch: apart
    times._add(0.01, 0.09, 4)
    assert times.share is None and times.bottleneck is None
    assert times.verdict() == "too few steps to tell whether the loader is the bottleneck"
    times._add(0.01, 0.09, 4)
    assert times.share == pytest.approx(0.1) and times.first_wait == 1.0
    assert times.as_dict()["samples_per_s"] == pytest.approx(8 / 0.2)


def _times(pairs, mode="transparent mode", optimized=False):
    """A loop timed by hand: (wait, step) per batch, the first one apart."""
    times = waits.LoopTimes("loop", "/data/project/train.py:7", mode, optimized)
    for wait, step in [(1.0, 0.5), *pairs]:
        times._add(wait, step, 4)
    return times


def test_the_verdict_is_graded_with_its_spread():
    """Each grade of GRADES, the share's median and p90 over the steps, and the speed-up a
    loader that kept up would give."""
    assert [_times([(w, 1 - w)] * 4).grade for w in (0.01, 0.05, 0.2, 0.7)] == \
        ["negligible", "minor", "partial", "severe"]
    steady = _times([(0.06, 0.04)] * 9 + [(0.08, 0.02)])
    assert steady.spread() == pytest.approx((0.6, 0.62))
    assert steady.speedup == pytest.approx((0.62 + 0.38) / 0.38)
    assert steady.verdict() == (
        "data loading is 62% of the step (per step: median 60%, p90 62%): the loader is the "
        "bottleneck: the step waits more than it works (severe); a loader that kept up would "
        f"make the loop {steady.speedup:.2f}x as fast")
    assert "too few steps" in _times([(0.1, 0.1)]).verdict() and _times([]).spread() is None


def test_what_to_try_next_follows_the_waits_and_the_mode():
    """A steady wait asks first for a loader that gives more per second (optimize, threads, a
    faster decode, more workers), waits in bursts first for a deeper queue; each tip in the
    mode's own spelling; optimize=True already on is not suggested again; a loader that keeps
    up gets none."""
    steady = _times([(0.05, 0.05)] * 10, mode="compiled generator")
    tips = steady.advice()
    assert [tip.split(":")[0] for tip in tips] == [
        "`@ndd.compile(optimize=True)`", "more threads", "a faster decode", "more workers",
        "a deeper queue"]
    assert "`@ndd.compile(num_threads=...)`" in tips[1] and 'device="gpu"' in tips[2]
    assert "prefetch_queue_depth" in tips[4]
    bursts = _times([(0.001, 0.1)] * 8 + [(0.03, 0.1)] * 2)
    assert bursts.share < waits.BOTTLENECK_SHARE <= bursts.spread()[1]
    assert "its waits come in bursts" in bursts.verdict() and bursts.grade == "minor"
    assert bursts.advice()[0].startswith("a deeper read-ahead") and \
        "`ndd_trace.enable(optimize=True)`" in bursts.advice()[1] and \
        "`ndd.set_num_threads(...)`" in bursts.advice()[2]
    optimized = _times([(0.05, 0.05)] * 10, mode="compiled generator", optimized=True)
    assert not any("optimize=True" in tip for tip in optimized.advice())
    assert _times([(0.001, 0.1)] * 10).advice() == []


def test_compare_with_replay_measures_what_a_loader_that_kept_up_would_give():
    """The same items, stepped through as loaded and again from memory: a slow loader's loop
    runs several times as fast replayed; the loop is closed as a `break` closes it."""
    closed = []

    def slow_loader():
        try:
            for index in range(100):
                time.sleep(0.05)
                yield index
        finally:
            closed.append(True)

    seen = []
    comparison = waits.compare_with_replay(slow_loader(), lambda item: (
        seen.append(item), time.sleep(0.01)), steps=6)
    assert seen == [0, *range(1, 7), *range(1, 7)] and closed == [True]
    assert comparison.steps == 6 and comparison.speedup > 2, comparison
    assert str(comparison).startswith("6 steps: ") and "x as fast (the loader costs" in \
        str(comparison)
    assert str(waits.ReplayComparison(10, 1.02, 1.0)).endswith(": the loader keeps up")
    with pytest.raises(ValueError, match="gave no item after its first"):
        waits.compare_with_replay(iter([1]), lambda item: None)


def test_compare_with_replay_of_a_compiled_loop(jpeg_dir):
    batches, reader = _loop(jpeg_dir)
    ndd_trace.reset_report()
    comparison = waits.compare_with_replay(
        batches(reader), lambda item: (item[0].torch(), item[1].torch()), steps=2)
    ndd_trace.reset_report()
    assert comparison.steps == 2 and comparison.live_s > 0 and comparison.replay_s > 0
    assert sum(1 for _ in batches(reader)) == 4  # the epoch left was ended: a new one is whole


def test_chart(tmp_path, monkeypatch):
    times = _times([(0.02, 0.05), (0.03, 0.05), (0.01, 0.05)])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="the wait chart needs matplotlib"):
            waits.chart(str(tmp_path / "waits.png"), [times])
    else:
        path = waits.chart(str(tmp_path / "waits.png"), [times])
        assert (tmp_path / "waits.png").stat().st_size > 1000 and path.endswith("waits.png")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as without matplotlib
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"needs matplotlib \(pip install matplotlib\)"):
        waits.chart(str(tmp_path / "other.png"), [times])


def test_the_chart_is_a_figure_of_its_own_with_a_scale_and_no_machine_path(tmp_path):
    """No pyplot and no backend chosen (the user's stays), no absolute path in the legend, and
    the references a wait is read against: the loop's own step, the 10% share."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn = waits.figure([_times([(0.02, 0.05), (0.03, 0.05), (0.01, 0.07)])])
    assert isinstance(drawn, Figure)
    waited, shares = drawn.axes
    legend = [text.get_text() for axes in drawn.axes for text in axes.get_legend().get_texts()]
    assert legend[0] == "loop (train.py:7, transparent mode): 26%, partial", legend
    assert "its own step, median (50.0 ms)" in legend and "a bottleneck from 10%" in legend
    assert shares.get_ylim() == (0, 100) and waited.get_ylabel() == "wait for data (ms)"
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(f"""\
        import sys
        import matplotlib
        matplotlib.use("svg")                      # the user's choice
        from ndd_trace.execution import waits
        times = waits.LoopTimes("loop", "x.py:1")
        for wait in (1.0, 0.02, 0.03):
            times._add(wait, 0.05, None)
        waits.chart({str(tmp_path / "waits.png")!r}, [times])
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        assert "matplotlib.pyplot" not in sys.modules
        """))
    completed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                               timeout=120, env=subprocess_env())
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert (tmp_path / "waits.png").read_bytes()[:4] == b"\x89PNG"


SCRIPT = f"""\
import time
import nvidia.dali.experimental.dynamic as ndd

reader = ndd.readers.File(file_root=ROOT, random_shuffle=True, seed=2)
for jpegs, labels in reader.next_epoch(batch_size=4):            # a loop that only loads
    images = ndd.resize(ndd.decoders.image(jpegs), size=[32, 32])
    images.torch()
other = ndd.readers.File(file_root=ROOT, random_shuffle=True, seed=2)
for jpegs, labels in other.next_epoch(batch_size=4):             # a loop that trains
    images = ndd.resize(ndd.decoders.image(jpegs), size=[32, 32])
    images.torch()
    time.sleep({SLEEP})
"""


def test_launcher_prints_the_verdicts_and_writes_them_per_rank(jpeg_dir, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).replace("ROOT", repr(str(jpeg_dir))))
    completed = subprocess.run(
        [sys.executable, "-m", "ndd_trace", "--report", "--wait-chart",
         str(tmp_path / "waits.png"), str(script)], cwd=tmp_path, capture_output=True,
        text=True, timeout=300,
        env=subprocess_env(NDD_TRACE_REPORT=str(tmp_path / "report.json"), RANK="1"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    err = completed.stderr
    assert "reader loops (the consumer's wait for data vs its own step):" in err
    assert f"{script}:5: File.next_epoch (transparent mode), 1 epoch(s), 3 batch(es)" in err
    assert f"{script}:9: File.next_epoch (transparent mode), 1 epoch(s), 3 batch(es)" in err
    assert err.count("a loader that kept up would make the loop") == 1, err
    assert err.count("the loader is not the bottleneck") == 1, err
    assert "ndd_trace report (transparent mode)\n" in err
    assert err.count("File.next_epoch (transparent mode)") == 2
    loops = json.loads((tmp_path / "report.rank1.json").read_text())["loops"]
    assert [entry["location"] for entry in loops] == [f"{script}:5", f"{script}:9"]
    assert [entry["bottleneck"] for entry in loops] == [True, False]
    assert (tmp_path / "waits.png").exists() or "no wait chart: the wait chart needs " \
        "matplotlib" in err
