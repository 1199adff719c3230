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
    state = "is" if bottleneck else "is not"
    assert times.verdict() == (f"data loading is {times.share:.0%} of the step: the loader "
                               f"{state} the bottleneck")
    if sleep:
        assert times.step >= 3 * SLEEP * 0.9  # the sleeps are the consumer's own step
    text = str(report)
    assert "reader loops (the consumer's wait for data vs its own step):" in text
    assert times.verdict() in text and "batches/s" in text and "samples/s" in text
    entry = report.as_dict()["loops"][0]
    assert entry["bottleneck"] is bottleneck and entry["batches"] == times.batches
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


def test_chart(tmp_path, monkeypatch):
    times = waits.LoopTimes("loop", "x.py:1")
    for wait in (1.0, 0.02, 0.03, 0.01):
        times._add(wait, 0.05, None)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="the wait chart needs matplotlib"):
            waits.chart(str(tmp_path / "waits.png"), [times])
    else:
        path = waits.chart(str(tmp_path / "waits.png"), [times])
        assert (tmp_path / "waits.png").stat().st_size > 1000 and path.endswith("waits.png")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as without matplotlib
    with pytest.raises(ImportError, match=r"needs matplotlib \(pip install matplotlib\)"):
        waits.chart(str(tmp_path / "other.png"), [times])


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
    assert f"{script}:5: File.next_epoch, 1 epoch(s), 3 batch(es)" in err
    assert f"{script}:9: File.next_epoch, 1 epoch(s), 3 batch(es)" in err
    assert err.count("the loader is the bottleneck") == 1, err
    assert err.count("the loader is not the bottleneck") == 1, err
    loops = json.loads((tmp_path / "report.rank1.json").read_text())["loops"]
    assert [entry["location"] for entry in loops] == [f"{script}:5", f"{script}:9"]
    assert [entry["bottleneck"] for entry in loops] == [True, False]
    assert (tmp_path / "waits.png").exists() or "no wait chart: the wait chart needs " \
        "matplotlib" in err
