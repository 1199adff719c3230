"""Transparent mode: unmodified scripts run plainly and through `python -m ndd_trace` agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import subprocess_env
from harness import assert_matches_eager, assert_same, observe, rng_state, run, seeded, to_numpy

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
CORPUS = ["classify", "detection_boxes", "external_numpy", "audio_1d", "data_dependent",
          "early_break", "warmup", "decode_loop"]
READER_LOOPS = {"classify", "early_break", "decode_loop"}


def _run(arguments: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = subprocess_env(NDD_TRACE_DATA=str(tmp_path))
    return subprocess.run([sys.executable, *arguments], cwd=SCRIPTS, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.parametrize("name", CORPUS)
def test_script_output_identical(name, tmp_path):
    plain = _run([f"{name}.py"], tmp_path)
    report_path = tmp_path / "report.json"
    traced = _run(["-m", "ndd_trace", "--report", "--report-json", str(report_path),
                   f"{name}.py"], tmp_path)
    assert plain.returncode == traced.returncode, traced.stderr
    assert plain.stdout == traced.stdout
    assert plain.stdout.strip(), "the script printed nothing to compare"
    report = json.loads(report_path.read_text())
    assert report["regions"] and report["ops_recorded"] > 0
    assert all(region["eager_reason"] is None for region in report["regions"])
    assert not report["eager_ops"], report  # everything was recorded
    assert any(region["cache_hits"] > 0 for region in report["regions"])
    if name in READER_LOOPS:  # read ahead, and the decode loop's steps ran ahead
        assert report["readers"], report
    if name in ("classify", "decode_loop"):
        assert any(region["run_ahead"] > 0 for region in report["regions"]), report
    assert "ndd_trace report" in traced.stderr


def test_script_arguments_and_exit_code(tmp_path):
    traced = _run(["-m", "ndd_trace", "classify.py", "--epochs", "1"], tmp_path)
    assert traced.returncode == 0 and "epoch 0 loss" in traced.stdout
    assert "epoch 1" not in traced.stdout
    assert _run(["-m", "ndd_trace", "early_break.py"], tmp_path).returncode == 3


def test_exceptions_and_tracebacks_like_plain_run(tmp_path):
    plain = _run(["raises.py"], tmp_path)
    traced = _run(["-m", "ndd_trace", "raises.py"], tmp_path)
    assert plain.returncode == traced.returncode == 1
    assert plain.stdout == traced.stdout, traced.stderr  # (failed once under load: its stderr)
    assert plain.stderr.strip().splitlines()[-1] == traced.stderr.strip().splitlines()[-1]
    assert 'raises.py", line 10' in traced.stderr


def test_enabled_context_matches_eager_with_random_ops(batch):
    def body(x):
        y = ndd.rotate(ndd.resize(x, size=[12, 12]),
                       angle=ndd.random.uniform(batch_size=x.batch_size, range=[-20, 20]),
                       keep_size=True)
        return (y * 2).slice[1:10] + ndd.cast(ndd.random.coin_flip(batch_size=x.batch_size),
                                               dtype=ndd.uint8)

    # the generator's state after: drawn at call time
    runs = assert_matches_eager(body, batch, modes=("transparent",), calls=3, seed=4, warn=None)
    report = runs["transparent"].report
    assert report.regions and report.regions[0].hits == 2
    with ndd_trace.enabled():
        assert ndd_trace.is_enabled()
    assert not ndd_trace.is_enabled()


def test_sync_eval_mode_runs_eagerly_and_is_reported(batch):
    ndd_trace.reset_report()
    with ndd_trace.enabled(), ndd.EvalMode.sync_cpu:
        result = ndd.flip(batch)
    assert_same(ndd.flip(batch), result)
    eager = ndd_trace.report().eager_ops
    assert any("synchronous" in reason for (_, reason, _), _count in eager.items())


def test_calls_in_an_entered_eager_eval_mode_start_at_once(batch):
    """`with ndd.EvalMode.eager:` asks for evaluation that "starts immediately" (DALI's
    test_async.test_eager_parallelism): those calls go to ndd at once and are reported, while
    the default mode's, and a `deferred` block's inside it, are recorded."""
    ndd_trace.reset_report()
    with ndd_trace.enabled():
        with ndd.EvalMode.eager:
            started = ndd.flip(batch)
            with ndd.EvalMode.deferred:
                recorded = ndd.flip(started) * 2
        default = ndd.flip(batch) * 3
        eager = ndd_trace.report().eager_ops
    assert [(op, count) for (op, reason, _), count in eager.items()
            if "EvalMode.eager" in reason] == [("flip", 1)]
    assert_same(ndd.flip(batch), started)
    assert_same(ndd.flip(ndd.flip(batch)) * 2, recorded)
    assert_same(ndd.flip(batch) * 3, default)


def test_rejected_call_raises_eager_error(batch):
    with ndd_trace.enabled(), pytest.raises(Exception) as info:
        np.asarray(ndd.as_tensor(ndd.resize(batch, size=[8, 8], interp_type="bogus")))
    assert "bogus" in str(info.value) or "interp" in str(info.value).lower()


def test_lazy_values_keep_working_after_disable(batch):
    with ndd_trace.enabled():
        pending = ndd.flip(batch) * 3
    assert_same(ndd.flip(batch) * 3, pending)


@pytest.mark.gpu
def test_transparent_mode_on_gpu(jpegs):
    def body(data):
        images = ndd.decoders.image(data, device="gpu")
        images = ndd.resize(images, size=[32, 32]) * 0.5
        noise = ndd.random.uniform(batch_size=images.batch_size, range=[0, 1], device="gpu")
        return images + noise

    runs = assert_matches_eager(body, jpegs, modes=("transparent",), calls=2, seed=2, warn=None)
    assert all(value.device == "gpu" for value in runs["transparent"].results)


def test_regions_keyed_by_the_fed_data_layout():
    """Found by the transparent-mode fuzzer: a value computed by an earlier region and fed to a
    later one must be keyed by its real layout, which inference may not know; otherwise two
    regions that differ only in that layout share a pipeline, and DALI refuses an external
    source whose layout changes between iterations."""
    from ndd_trace.modes import lazy, regions
    from ndd_trace.modes.proxies import lazy_handle

    data = ndd.as_batch([np.ones((4, 6, 3), np.float32)] * 2, layout="HWC")
    with ndd_trace.enabled():
        moved = ndd.transpose(data, perm=[1, 0, 2])
        summed = ndd.reductions.sum(moved, axes=[0], keep_dims=True).slice[0:]
        result = ndd.transpose(summed, perm=[1, 0, 2])  # recorded before `summed` runs
        summed.shape  # runs the first region; `summed` is then fed to `result`'s region
        tracer = lazy._local().tracer
        node = lazy_handle(result).ref.node
        leaves = regions.region_view(tracer.regions.pending_cone(node), node, clone=False).leaves
        assert lazy_handle(summed).meta.layout is None  # inference does not know it...
        assert leaves[0].meta[0].layout == "WHC"  # ...the key uses the data's own
        assert_same(ndd.transpose(ndd.reductions.sum(ndd.transpose(data, perm=[1, 0, 2]),
                                                     axes=[0], keep_dims=True),
                                  perm=[1, 0, 2]), result)


def test_deferred_eval_mode_records_one_region(batch):
    """While ndd_trace is enabled, `with ndd.EvalMode.deferred:` means what it says: the calls
    are recorded and run as one cached pipeline when consumed (sync modes stay eager)."""
    def body(x):
        angle = ndd.random.uniform(batch_size=x.batch_size, range=[-10, 10])
        y = ndd.rotate(ndd.flip(x, horizontal=1), angle=angle, keep_size=True)
        return (y * 2).slice[2:20]

    copied = ndd.batch(batch)  # (an op given user data as it is runs at the call, deferred too)
    eager = run(body, copied, calls=3, seed=6)
    ndd_trace.reset_report()
    with seeded(6), ndd_trace.enabled(), ndd.EvalMode.deferred:
        lazy = [body(copied) for _ in range(3)]
        assert all(value._storage is None for value in lazy)  # nothing ran yet
        assert_same(eager.results, lazy)
    assert rng_state() == eager.rng
    report = ndd_trace.report()
    assert len(report.regions) == 1 and report.regions[0].num_ops == 5
    assert report.regions[0].run_count == 3 and report.regions[0].hits == 2
    assert not report.eager_ops


# ---------------------------------------------------------------------------------------------
# A call site recorded again from its last call (sites.CallSites.replay): only where the call
# is given what the last one was; every other call is recorded from scratch.


def _site_loop(batch, settings):
    """One call site per op, called with the step's own arguments and data."""
    outputs = []
    for hue, size, dtype, data in settings:
        x = data if data is not None else batch
        w = ndd.flip(x, horizontal=1)  # its output type is its input's
        y = ndd.hsv(x, hue=hue, saturation=1.2)
        z = ndd.resize(y, size=size)
        z = ndd.cast(z, dtype=dtype)
        outputs.append(((z, w), (z.dtype, z.ndim, w.dtype, w.ndim, y.layout)))
    return outputs


def _replays(settings, batch):
    """The calls a transparent run of the sites replayed, the run's outputs and their metadata
    (read right after each call) those of eager's (tests/harness.py)."""
    runs = assert_matches_eager(_site_loop, batch, settings, modes=("transparent",), warn=None)
    report = runs["transparent"].report
    assert report.ops_recorded == 4 * len(settings)
    assert report.as_dict()["ops_replayed"] == report.ops_replayed
    return report.ops_replayed


def test_call_site_replay_matches_eager_as_arguments_change(batch):
    """Same site, arguments that compare equal in Python but are different DALI arguments
    (0.0 and -0.0, 1 and 1.0 and True, lists of either), other data and types: every step as
    eager, bit for bit, dtype and ndim included."""
    wide = ndd.cast(batch, dtype=ndd.int16)
    settings = [(10.0, [12, 12], ndd.float32, None),
                (10.0, [12, 12], ndd.float32, None),  # the same call: replayed
                (-0.0, [12, 12], ndd.float32, None),
                (0.0, [12, 12], ndd.float32, None),
                (1, [12.0, 12], ndd.uint8, None),
                (1.0, [12, 12.0], ndd.uint8, None),
                (True, [12, 12], ndd.float16, None),
                (10.0, [12, 12], ndd.float32, wide),  # int16 data at the same sites
                (10.0, [12, 12], ndd.float32, None)]
    assert _replays(settings, batch) >= 3


def test_call_site_replay_keeps_random_draws_and_sample_mode(batch):
    """A random op's site replays with the generator given at this call; a site called with
    a Tensor after a Batch records the sample-mode call anew."""

    def sites():
        rng = ndd.random.RNG(seed=77)

        def body(x, use_rng):
            angle = ndd.random.uniform(batch_size=x.batch_size, range=[-20, 20],
                                       rng=rng if use_rng else None)
            return ndd.rotate(x, angle=angle, keep_size=True)

        out = [body(batch, False), body(batch, False), body(batch, True), body(batch, False)]
        for x in (batch.select(0), batch, batch):
            out.append(ndd.flip(x, horizontal=1))
        return [observe(o) for o in out], str(rng.state)

    assert_matches_eager(sites, modes=("transparent",), seed=5, warn=None)


def test_call_site_replay_records_anew_when_the_data_changes_type(batch):
    """Data of another type at a site that replayed: recorded anew (other output metadata),
    then replayed again once the type is back."""
    _replays([(10.0, [8, 8], ndd.float32, None),
              (10.0, [8, 8], ndd.float32, ndd.cast(batch, dtype=ndd.int16)),
              (10.0, [8, 8], ndd.float32, None)], batch)


def test_len_list_tuple_and_star_of_lazy_values_as_eager(batch):
    """Generic code consumes a Batch the ways Python offers: `len()` raises eager's TypeError
    (ndd's Batch and Tensor have none; ndd_trace's internal break escaped `except`), and
    `list()`, `tuple()`, `[*x]` give eager's samples (issue 35)."""
    def consume():
        y = batch * 2
        seen = []
        for value in (y, y.select(0)):
            try:
                seen.append(("len", len(value)))
            except TypeError as error:
                seen.append(("TypeError", str(error)))
        seen.append([to_numpy(t).tolist() for t in list(y)])
        seen.append([to_numpy(t).tolist() for t in tuple(y)])
        seen.append([to_numpy(t).tolist() for t in [*y]])
        return seen

    eager = assert_matches_eager(consume, modes=("transparent",), seed=None,
                                 warn=None)["eager"].result
    assert tuple(eager[0]) == ("TypeError", "object of type 'Batch' has no len()")


def test_values_are_eager_batches_and_tensors(batch):
    """Printing a value, its type and the errors that name it are eager's: transparent mode's
    values are ndd.Batch and ndd.Tensor themselves, their data run when read (issue 35)."""
    def look():
        y = ndd.resize(batch, size=[4, 4]) * 2
        sample = ndd.math.abs(ndd.as_tensor(np.arange(6, dtype=np.int16).reshape(2, 3)) - 3)
        seen = [type(y).__name__, type(y) is ndd.Batch, type(sample) is ndd.Tensor,
                y.dtype, y.layout, y.ndim, sample.dtype, sample.ndim]
        try:
            y[0]
        except TypeError as error:
            seen.append(str(error))
        seen += [repr(y), repr(sample), str(sample), type(y.select(1)).__name__,
                 to_numpy(sample[1:, ::2]).tolist()]
        return seen

    eager = assert_matches_eager(look, modes=("transparent",), seed=None, warn=None)
    assert eager["eager"].result[:3] == ["Batch", True, True]


def test_lazy_tensor_fields():
    """A lazy Tensor's fields (dtype, shape) and its data, read by ndd itself (`ndd.as_tensor`,
    `ndd.batch` of lazy tensors), are eager's (found in review: it once gave a silently wrong
    result)."""
    t = ndd.as_tensor(np.arange(6, dtype=np.float32))
    with ndd_trace.enabled():
        u = t * 2
        u.evaluate()
        assert u.dtype == ndd.float32 and (t * 4).shape == (6,)
        np.testing.assert_array_equal(np.asarray(ndd.as_tensor(t * 3)),
                                      np.arange(6, dtype=np.float32) * 3)
        stacked = ndd.batch([t * 3, t * 3 + 1])  # ndd copies the lazy tensors' fields
        np.testing.assert_array_equal(np.asarray(ndd.as_tensor(stacked))[1],
                                      np.arange(6, dtype=np.float32) * 3 + 1)


def test_batch_proxies_have_no_array_protocol_where_batch_has_none():
    """A Batch has no `__array__`, `__dlpack__` or `item`, and neither have the values a trace
    or transparent mode hands the function (found by an independent differential fuzzer,
    ../shared/repros/fuzz)."""
    x = ndd.as_batch([np.zeros((2,), np.uint8)])
    seen = {}

    def f(x):
        y = x + 1
        seen["traced"] = [hasattr(y, name) for name in ("__array__", "__dlpack__", "item")]
        return y

    ndd.compile(f)(x)
    with ndd_trace.enabled():
        y = x + 1
        seen["lazy"] = [hasattr(y, name) for name in ("__array__", "__dlpack__", "item")]
    assert seen["traced"] == seen["lazy"] == [False, False, False]
    assert [hasattr(x, name) for name in ("__array__", "__dlpack__", "item")] == [False] * 3


def test_numpy_array_of_a_batch_is_an_object_array_as_eagerly():
    """`np.asarray` of a Batch is eager's 0-d object array holding the Batch, compiled (a graph
    break) and in transparent mode (found by an independent differential fuzzer,
    ../shared/repros/fuzz)."""
    x = ndd.as_batch([np.arange(18, dtype=np.uint8).reshape(2, 3, 3)], layout="HWC")

    def f(x):
        return np.asarray(ndd.flip(x, horizontal=1))

    eager = f(x)
    with pytest.warns(ndd_trace.NddTraceWarning, match="numpy"):
        compiled = ndd.compile(f)(x)
    for result in (compiled, _transparent_value(f, x)):
        assert result.dtype == eager.dtype == object and result.shape == eager.shape == ()
        assert_same(eager.item(), result.item())


def _transparent_value(function, *args):
    with ndd_trace.enabled():
        return function(*args)


def _bytes(batch) -> list[bytes]:
    return [sample.tobytes() for sample in to_numpy(batch)]


def test_numbers_held_in_variables_are_passed_as_eager_passes_them(batch):
    """A number held in a variable (a config value) is a per-call tensor argument eagerly, as
    a list in one is, and DALI reads some ops' such arguments otherwise (normalize rejects a
    0-d mean): every step of a loop gives eager's values or eager's error (issue 35)."""
    config = {"angle": 12.0, "mean": 118.0, "std": 57.0}

    def steps():
        seen = []
        for step in range(3):
            angle = config["angle"] + step // 2
            seen.append(_bytes(ndd.rotate(batch, angle=angle, keep_size=True)))
            try:
                out = ndd.normalize(ndd.cast(batch, dtype=ndd.float32), mean=config["mean"],
                                    stddev=config["std"])
                seen.append(_bytes(out))
            except Exception as error:  # noqa: BLE001 (compared with eager's)
                seen.append((type(error).__name__, str(error).splitlines()[0]))
        return seen

    eager = assert_matches_eager(steps, modes=("transparent",), seed=None, warn=None)
    assert eager["eager"].result[1][0] == "RuntimeError"


@pytest.mark.parametrize("call", ["add", "cat", "random"])
def test_empty_batches_run_as_eager_runs_them(call):
    """A call on an empty batch (every sample filtered out) is eager ndd's own: its error (an
    IndexError for `x + x`, a RuntimeError for `cat`, a ValueError for a random op's batch size)
    where eager raises it (found by a new-user probe: empty Batches came back)."""
    def step(x):
        if call == "add":
            out = x + x
        elif call == "cat":
            out = ndd.cat(x, x, axis=0)
        else:
            out = ndd.rotate(x, angle=ndd.random.uniform(batch_size=x.batch_size, range=[0, 9]))
        return [np.asarray(sample) for sample in out]

    assert_matches_eager(step, ndd.as_batch([], dtype=ndd.uint8), modes=("transparent",),
                         warn="ignore")


def test_pending_values_copy_and_pickle_as_eager_ones_fail():
    """`copy.deepcopy` and `pickle.dumps` of a value not run yet fail as eager's pending result
    does: the invocation's lock, DALI's operator class (found by a new-user probe: other types
    and texts, an `except pickle.PicklingError` missed one). Compared with eager by whether it
    raised; the texts are eager's pending result's, checked apart: eager's own depend on whether
    its run has finished by then (then the TensorList it left), which a loaded machine changes."""
    import copy
    import pickle

    def copied(x, operation):
        try:
            operation(ndd.flip(x, horizontal=1) * 2)
        except (TypeError, pickle.PicklingError):
            return "raised"
        return "copied"

    images = ndd.as_batch([np.zeros((4, 5, 3), np.uint8)] * 2, layout="HWC")  # user data
    for operation in (copy.deepcopy, pickle.dumps):
        assert_matches_eager(copied, images, operation, modes=("transparent",), warn="ignore")
    with ndd_trace.enabled():
        pending = ndd.flip(images, horizontal=1) * 2
        with pytest.raises(TypeError, match=r"cannot pickle '_thread\.lock' object"):
            copy.deepcopy(pending)
        with pytest.raises(pickle.PicklingError, match="_ArithmeticGenericOp"):
            pickle.dumps(pending)


def test_a_failed_decode_logs_on_stderr_what_a_plain_run_logs(tmp_path):
    # a failed run is replayed eagerly to learn eager's error, and a step whose run launched
    # ahead failed is not run again: the codec's log lines are printed once each, as eagerly
    plain = _run(["corrupt_jpeg.py"], tmp_path)
    traced = _run(["-m", "ndd_trace", "corrupt_jpeg.py"], tmp_path)
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert plain.stdout == traced.stdout and "step 1 skipped" in plain.stdout
    assert "epoch 0 ended: RuntimeError" in plain.stdout
    assert "[ERROR]" in plain.stderr
    assert plain.stderr == traced.stderr


def test_tracebacks_of_asynchronous_and_reader_errors_are_a_plain_runs(tmp_path):
    """Found by the twenty-second session's sweep: the cause of an asynchronous run's error
    showed the launcher's frames (runpy, ndd_trace/__main__.py), printed and through
    `traceback.format_exc()`; a batch size eager refuses showed ndd_trace's own frames."""
    plain = _run(["async_error.py"], tmp_path)
    traced = _run(["-m", "ndd_trace", "async_error.py"], tmp_path)
    assert plain.returncode == traced.returncode == 1
    assert "epoch 0 done" in plain.stdout and "__main__" not in plain.stdout
    assert plain.stdout == traced.stdout
    assert plain.stderr == traced.stderr


def _casts(batch, types):
    return [ndd.cast(ndd.flip(batch, horizontal=1), dtype=dtype) for dtype in types]


def test_past_four_regions_at_a_line_a_new_one_runs_eagerly_until_worth_making(batch):
    """A line whose regions keep changing costs eager's time, not a build per call: past 4
    regions made at a line, a new one runs eagerly until its calls have taken about as long as
    making a region there did; the values are eager's."""
    types = [ndd.uint8, ndd.int16, ndd.int32, ndd.float32, ndd.float64, ndd.uint16]
    runs = assert_matches_eager(_casts, batch, types + types[4:] * 2, modes=("transparent",),
                                warn="error")
    report = runs["transparent"].report.as_dict()
    # float32 once, float64 and uint16 until worth making (at the second call where the line's
    # regions cost more to make than the calls took, which is not sure on a loaded machine)
    assert [row["count"] for row in report["eager_ops"]][0] >= 3
    assert report["eager_ops"][0]["reason"].startswith("a new region at a line that made 4")
    casts = [row for row in report["regions"] if row["op_chain"] == "cast[cpu]"]
    assert 3 <= len(casts) <= 5 and all(row["eager_reason"] is None for row in casts)
