"""Conformance: what DALI documents for dynamic mode holds the same with transparent mode on.

Each test runs a scenario once plainly and once inside `ndd_trace.enabled()` (tests/harness.py's
`assert_matches_eager`, mode "transparent") and compares the two observations exactly (values,
types, errors: their type, message, cause and moment, warnings, metadata). Covered: DALI's capture mode (`next_epoch(capture=True)`, `ExternalSource.captured()`
and the errors it raises), eval modes, exceptions, result metadata, checkpoints with readers.
Cases marked xfail (strict) differ on the current main: issue 9; they flip to a failure once
fixed, and the marker goes.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import assert_matches_eager

import ndd_trace

BATCH = 4


def outcome(fn: Callable[[], Any]) -> str:
    """'ok', or the raised exception as `Type: first line of the message`."""
    try:
        fn()
        return "ok"
    except Exception as error:  # noqa: BLE001
        return describe(error)


def describe(error: BaseException | None) -> str | None:
    if error is None:
        return None
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def is_captured(value: Any) -> bool:
    """Whether a result comes from DALI's capture-mode pipeline (CapturedBatch provenance)."""
    from nvidia.dali.experimental.dynamic._capture import CapturedBatch

    return isinstance(value, CapturedBatch) and getattr(value, "_capture_ref", None) is not None


def values(batch: Any) -> list:
    return np.asarray(ndd.as_tensor(batch, pad=True)).tolist()


def caught_messages(caught: list) -> list[str]:
    return [f"{w.category.__name__}: {str(w.message)[:80]}" for w in caught
            if not issubclass(w.category, ndd_trace.NddTraceWarning)]


def es_batches(n: int, dim: int = 3, **kwargs: Any) -> ndd.ExternalSource:
    batches = [ndd.batch([np.full((dim,), b * BATCH + s, np.float32) for s in range(BATCH)])
               for b in range(n)]
    return ndd.ExternalSource(batches, **kwargs)


def const_es(value: list) -> ndd.ExternalSource:
    sample = np.asarray(value, np.float32)
    return ndd.ExternalSource(lambda: ndd.batch([sample] * BATCH))


# ---------------------------------------------------------------------------------------------
# Capture mode: loops DALI traces and replays itself


def _reader_capture_loop(root: str) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = ndd.readers.File(file_root=root, pad_last_batch=True)
        captured, sums = [], []
        for _ in range(2):  # the first epoch traces, the second replays
            for jpegs, labels in reader.next_epoch(batch_size=BATCH, capture=True):
                images = ndd.resize(ndd.decoders.image(jpegs), size=[16, 16])
                captured.append((is_captured(images), is_captured(labels)))
                sums.append(int(np.asarray(ndd.as_tensor(images)).sum()))
    return {"captured": captured, "sums": sums, "warnings": caught_messages(caught)}


def test_capture_reader_loop(jpeg_dir):
    assert_matches_eager(_reader_capture_loop, str(jpeg_dir), modes=("transparent",), raises=False)


def _es_captured_loop() -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        es = es_batches(3)
        seen = []
        for batch in es.captured(batch_size=BATCH):
            out = ndd.cast(batch, dtype=ndd.int32)
            seen.append((is_captured(batch), is_captured(out), values(out)))
    return {"seen": seen, "warnings": caught_messages(caught)}


def test_capture_external_source_loop():
    assert_matches_eager(_es_captured_loop, modes=("transparent",), raises=False)


def _capture_feeder(root: str) -> dict:
    reader = ndd.readers.File(file_root=root, pad_last_batch=True)
    size = ndd.ExternalSource(lambda: np.array([16, 16], dtype=np.float32))
    seen = []

    def run() -> None:
        for _ in range(2):
            for jpegs, _ in reader.next_epoch(batch_size=BATCH, capture=True):
                s = size()
                images = ndd.resize(ndd.decoders.image(jpegs), size=s)
                seen.append((type(s).__name__, is_captured(images),
                             int(np.asarray(ndd.as_tensor(images)).sum())))

    return {"outcome": outcome(run), "seen": seen}


def test_capture_feeder_broadcast(jpeg_dir):
    assert_matches_eager(_capture_feeder, str(jpeg_dir), modes=("transparent",), raises=False)


def _capture_empty_graph(root: str) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = ndd.readers.File(file_root=root)
        for jpegs, _ in reader.next_epoch(batch_size=BATCH, capture=True):
            jpegs.evaluate()
        after = outcome(lambda: next(iter(reader.next_epoch(batch_size=BATCH))))
    return {"warnings": caught_messages(caught), "reused eagerly": after}


def test_capture_empty_graph_warns(jpeg_dir):
    assert_matches_eager(_capture_empty_graph, str(jpeg_dir), modes=("transparent",), raises=False)


def _capture_errors(root: str) -> dict:
    def op_batch_size_changed() -> None:
        reader = ndd.readers.File(file_root=root)
        for jpegs, _ in reader.next_epoch(batch_size=BATCH, capture=True):
            ndd.resize(ndd.decoders.image(jpegs), size=[16, 16])
        for jpegs, _ in reader.next_epoch(batch_size=BATCH, capture=True):
            ndd.resize(ndd.decoders.image(jpegs), size=[16, 16], batch_size=8)

    def epoch_batch_size_changed() -> None:
        reader = ndd.readers.File(file_root=root)
        for _ in reader.next_epoch(batch_size=BATCH, capture=True):
            break
        for _ in reader.next_epoch(batch_size=8, capture=True):
            break

    def requires_batch_size() -> None:
        reader = ndd.readers.File(file_root=root)
        for _ in reader.next_epoch(capture=True):
            break

    def random_drawn_differently() -> None:
        rng = ndd.random.RNG(seed=21)
        reader = ndd.readers.File(file_root=root, pad_last_batch=True)
        for step, _ in enumerate(reader.next_epoch(batch_size=BATCH, capture=True)):
            ndd.random.uniform(batch_size=BATCH, range=[0.0, 1.0], shape=[5], rng=rng)
            if step > 0:
                ndd.random.uniform(shape=3, rng=rng)

    def feeder_exhausted() -> None:
        es = const_es([1, 1])
        short = es_batches(1)
        for batch in es.captured(batch_size=BATCH):
            ndd.cast(batch, dtype=ndd.float32)
            ndd.cast(short(), dtype=ndd.float32)

    def feeder_read_twice() -> None:
        es, co = const_es([1, 1]), const_es([2, 2])
        for batch in es.captured(batch_size=BATCH):
            ndd.cast(batch, dtype=ndd.float32)
            ndd.cast(co(), dtype=ndd.float32)
            ndd.cast(co(), dtype=ndd.float32)

    def es_batch_size_at_runtime() -> None:
        counter = itertools.count()
        es = ndd.ExternalSource(
            lambda: ndd.batch([np.zeros(3, np.float32)] * (BATCH if next(counter) == 0 else 5)))
        for batch in es.captured(batch_size=BATCH):
            ndd.cast(batch, dtype=ndd.float32)

    cases = [op_batch_size_changed, epoch_batch_size_changed, requires_batch_size,
             random_drawn_differently, feeder_exhausted, feeder_read_twice,
             es_batch_size_at_runtime]
    return {case.__name__: outcome(case) for case in cases}


def test_capture_errors(jpeg_dir):
    assert_matches_eager(_capture_errors, str(jpeg_dir), modes=("transparent",), raises=False)


def _capture_mode_switching(root: str) -> dict:
    def to_capture() -> None:
        reader = ndd.readers.File(file_root=root)
        for _ in reader.next_epoch(batch_size=BATCH):
            break
        for _ in reader.next_epoch(batch_size=BATCH, capture=True):
            break

    def to_eager() -> None:
        reader = ndd.readers.File(file_root=root)
        for _ in reader.next_epoch(batch_size=BATCH, capture=True):
            break
        for _ in reader.next_epoch(batch_size=BATCH):
            break

    def es_captured_after_eager() -> None:
        es = es_batches(3)
        es()
        for _ in es.captured(batch_size=BATCH):
            pass

    def es_eager_while_captured() -> None:
        es = es_batches(3)
        es.captured(batch_size=BATCH)
        es()

    return {case.__name__: outcome(case)
            for case in (to_capture, to_eager, es_captured_after_eager, es_eager_while_captured)}


def test_capture_mode_switching_errors(jpeg_dir):
    assert_matches_eager(_capture_mode_switching, str(jpeg_dir), modes=("transparent",),
                         raises=False)


def _capture_random_parity(root: str) -> dict:
    rng = ndd.random.RNG(seed=42)
    reader = ndd.readers.File(file_root=root, pad_last_batch=True)
    draws = []
    for _ in range(2):
        for _ in reader.next_epoch(batch_size=BATCH, capture=True):
            out = ndd.random.uniform(batch_size=BATCH, range=[0.0, 1.0], shape=[3], rng=rng)
            draws.append((is_captured(out), values(out)))
    return {"draws": draws, "rng state after": str(rng.state)}


def test_capture_random_parity(jpeg_dir):
    assert_matches_eager(_capture_random_parity, str(jpeg_dir), modes=("transparent",),
                         raises=False)


# ---------------------------------------------------------------------------------------------
# Eval modes: when an error is raised, its type, message and cause

MODES = ["deferred", "eager", "sync_cpu", "sync_full"]


def _moment(make: Callable[[], Any], mode: str) -> dict:
    """Where the error of `make()` shows: at the call, at `.evaluate()`, or not at all."""
    moment, error = "none", None
    with getattr(ndd.EvalMode, mode):
        try:
            result = make()
            moment = "evaluate"
            result.evaluate()
            moment = "none"
        except Exception as exc:  # noqa: BLE001
            error = exc
            moment = "call" if moment == "none" else moment
    return {"moment": moment if error else "none",
            "type": type(error).__name__ if error else None,
            "cause": describe(error.__cause__) if error else None,
            "message": describe(error)}


def _moment_without_message(make: Callable[[], Any], mode: str) -> dict:
    observed = _moment(make, mode)
    del observed["message"]
    return observed


ERROR_CASES = {
    # run-time operator errors (DALI's C++ error at run time)
    "crop_too_big": lambda: ndd.crop(ndd.zeros(shape=(10, 10, 3)), crop=(20, 20)),
    "reshape_mismatch": lambda: ndd.reshape(ndd.tensor([1, 2, 3]), shape=[2]),
    "ragged_as_tensor": lambda: ndd.as_tensor(ndd.batch([[1, 2], [3]])),
    # call-time validation: a 2-D image to resize, an unknown argument
    "validation_at_call": lambda: ndd.resize(ndd.zeros(shape=(10, 10), dtype=ndd.uint8),
                                             size=[4, 4]),
    "bad_argument": lambda: ndd.flip(ndd.zeros(shape=(4, 4, 3)), no_such_argument=1),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_eval_mode_error_moment(case, mode):
    """Same moment (call / evaluate), same exception type, same cause (type and text)."""
    assert_matches_eager(_moment_without_message, ERROR_CASES[case], mode, modes=("transparent",),
                         raises=False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_eval_mode_error_message(case, mode):
    """The raised error's own message too (stricter than the moment/type/cause test): a run
    error used later says "An error happened during deferred evaluation / asynchronous
    execution", caused by DALI's error, as eager ndd's."""
    assert_matches_eager(_moment, ERROR_CASES[case], mode, modes=("transparent",), raises=False)


def _runtime_error_catchable() -> dict:
    caught = {}
    for mode in MODES:
        with getattr(ndd.EvalMode, mode):
            try:
                ndd.crop(ndd.zeros(shape=(10, 10, 3)), crop=(20, 20)).evaluate()
                caught[mode] = "no error"
            except RuntimeError as error:
                cause = error.__cause__
                caught[mode] = (type(error).__name__, isinstance(cause, RuntimeError),
                                str(cause) if cause is not None else None)
    return caught


def test_runtime_error_type_and_cause():
    assert_matches_eager(_runtime_error_catchable, modes=("transparent",), raises=False)


def _eval_mode_nesting() -> dict:
    seen = []
    with ndd.EvalMode.eager:
        seen.append(str(ndd.EvalMode.current))
        with ndd.EvalMode.deferred:
            seen.append(str(ndd.EvalMode.current))
        seen.append(str(ndd.EvalMode.current))
    return {"modes": seen}


def test_eval_mode_nesting():
    assert_matches_eager(_eval_mode_nesting, modes=("transparent",), raises=False)


# ---------------------------------------------------------------------------------------------
# Result metadata, before and after evaluation

ATTRS = ("dtype", "ndim", "layout", "device")


def _metadata(make: Callable[[], Any], check_ran: bool = True) -> dict:
    with ndd.EvalMode.deferred:
        result = make()
        results = result if isinstance(result, tuple) else (result,)
        # dtype and layout first: whether reading them ran the op (ndd answers them from
        # DALI's inference where it can, also where the ndim is not known before the run)
        early = [{a: str(getattr(r, a)) for a in ("dtype", "layout")} for r in results]
        ran = [r._invocation_result._invocation._results is not None for r in results
               if check_ran]
        before = [{a: str(getattr(r, a)) for a in ATTRS} for r in results]
        for r in results:
            r.evaluate()
        after = [{a: str(getattr(r, a)) for a in (*ATTRS, "shape")} for r in results]
    return {"early": early, "ran at dtype/layout": ran, "before": before, "after": after,
            "types": [isinstance(r, (ndd.Tensor, ndd.Batch)) for r in results]}


def _image() -> Any:
    return ndd.zeros(shape=(4, 4, 3), dtype=ndd.uint8, layout="HWC")


METADATA_CASES = {
    "flip": lambda: ndd.flip(_image(), horizontal=1),
    "crop_float": lambda: ndd.crop(_image(), crop=(2, 2), dtype=ndd.float32),
    "cast": lambda: ndd.cast(_image(), dtype=ndd.float32),
    "resize": lambda: ndd.resize(_image(), resize_x=2, resize_y=2),
    "hsv": lambda: ndd.hsv(_image(), hue=10.0),
    "cmn": lambda: ndd.crop_mirror_normalize(_image(), crop=(2, 2)),
    "coin_flip": lambda: ndd.random.coin_flip(),
    "uniform_shape": lambda: ndd.random.uniform(shape=[4]),
    # a call site eager cannot analyse (`**kwargs`): the shape is a tensor argument, the ndim
    # unknown before the run, the layout known (none) and answered without running
    "uniform_shape_kwargs": lambda: ndd.random.uniform(**{"shape": [4]}),
    "coin_flip_shape_variable": lambda: _coin_flip_with_shape([2, 3]),
    "random_bbox_crop": lambda: ndd.random_bbox_crop(ndd.zeros(shape=(1, 4),
                                                               dtype=ndd.float32)),
    "stack": lambda: ndd.stack(ndd.as_batch([[[1], [2]], [[10], [20]]], layout="AB"),
                               ndd.as_batch([[[3], [4]], [[30], [40]]], layout="AB"),
                               axis=1, axis_name="C"),
    "expand_dims": lambda: ndd.expand_dims(ndd.as_batch([[1, 2], [10, 20]], layout="A"),
                                           axes=[0, 2], new_axis_names="BC"),
    "slice": lambda: ndd.as_batch([ndd.zeros(shape=(2, 3, 4), dtype=ndd.int8)] * 2,
                                  layout="XYZ").slice[:, 1, :],
    "arithmetic": lambda: _image() * 2 + 1,
    # per_frame: DALI's inference leaves the layout open; eager ndd runs the op to learn it
    "per_frame": lambda: ndd.per_frame(ndd.tensor([[[1, 0, 0], [0, 1, 0]]] * 2)),
    "per_frame_replace": lambda: ndd.per_frame(
        ndd.tensor(np.zeros((2, 3, 4), np.float32), layout="CHW"), replace=True),
    "per_frame_sequence": lambda: ndd.per_frame(
        ndd.as_batch([np.zeros((2, 3), np.float32)] * 2, layout="FX")),
    "warp_per_frame": lambda: ndd.warp_affine(
        ndd.as_batch([ndd.zeros(shape=(30, 40, 3), dtype=ndd.uint8)] * 2, layout="HWC"),
        ndd.per_frame(ndd.tensor([[[1, 0, 0], [0, 1, 0]], [[0.9, 0.1, 0], [-0.1, 0.9, 0]]]))),
    "warp_per_frame_argument": lambda: ndd.warp_affine(
        ndd.as_batch([ndd.zeros(shape=(2, 30, 40, 3), dtype=ndd.uint8)] * 2, layout="FHWC"),
        matrix=ndd.per_frame(ndd.tensor([[[1, 0, 0], [0, 1, 0]]] * 2, dtype=ndd.float32))),
}
XFAIL_METADATA: dict[str, str] = {}
# eager ndd runs a per_frame call to learn its layout (DALI's inference leaves it open);
# transparent mode knows it without running (docs/limitations.md: evaluation moments)
RUN_FOR_LAYOUT = {"per_frame", "per_frame_sequence"}


def _coin_flip_with_shape(shape: list) -> Any:
    return ndd.random.coin_flip(shape=shape)


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=XFAIL_METADATA[name]))
    if name in XFAIL_METADATA else name for name in METADATA_CASES])
def test_result_metadata(case):
    assert_matches_eager(_metadata, METADATA_CASES[case], case not in RUN_FOR_LAYOUT,
                         modes=("transparent",), raises=False)


def _invocation_record() -> dict:
    with ndd.EvalMode.deferred:
        out = ndd.flip(_image(), horizontal=1)
        record = out._invocation_result._invocation
        before = record._results is None
        out.evaluate()
        after = out._invocation_result._invocation._results is not None
    return {"results before": before, "results after": after}


def test_invocation_record():
    assert_matches_eager(_invocation_record, modes=("transparent",), raises=False)


def _process_params_at_call(mode: str) -> dict:
    from nvidia.dali.experimental.dynamic._ops import Operator

    calls = []
    original = Operator.__dict__["_process_params"]

    def spy(cls, *args, **kwargs):
        calls.append(cls.__name__)
        return original.__func__(cls, *args, **kwargs)

    Operator._process_params = classmethod(spy)
    try:
        with getattr(ndd.EvalMode, mode):
            image = ndd.tensor(np.zeros((16, 20, 3), np.uint8), layout="HWC")
            matrix = ndd.tensor(np.array([[1, 0, 0], [0, 1, 0]], np.float32))
            out = ndd.warp_affine(image, matrix=matrix)
            at_call = list(calls)
            out.evaluate()
    finally:
        Operator._process_params = original
    return {"at call": at_call, "after evaluation": calls}


@pytest.mark.parametrize("mode", MODES)
def test_operator_process_params_at_call(mode):
    """A spy on `Operator._process_params` sees each call at the call (transparent mode runs
    calls eagerly while DALI's method is replaced)."""
    assert_matches_eager(_process_params_at_call, mode, modes=("transparent",), raises=False)


def _process_params_restored() -> dict:
    """Once the spy is gone, calls are recorded again (the same values either way)."""
    from nvidia.dali.experimental.dynamic._ops import Operator

    original = Operator.__dict__["_process_params"]
    Operator._process_params = classmethod(lambda cls, *a, **k: original.__func__(cls, *a, **k))
    try:
        spied = values(ndd.cast(ndd.as_batch([np.arange(6)] * 2), dtype=ndd.float32))
    finally:
        Operator._process_params = original
    with ndd.EvalMode.deferred:
        out = ndd.cast(ndd.zeros(shape=(2, 3), dtype=ndd.int32), dtype=ndd.float32)
        recorded = ndd_trace.is_enabled() and not out._invocation_result._invocation._results
        result = values(out)
    return {"spied": spied, "result": result, "recorded or plain": recorded
            or not ndd_trace.is_enabled()}


def test_operator_process_params_restored():
    assert_matches_eager(_process_params_restored, modes=("transparent",), raises=False)


def _instance_cache() -> dict:
    """DALI's EvalContext keeps the operator instances its eager calls created, keyed by which
    arguments the call site shows to be invariant (construction arguments) and which not."""
    image = ndd.tensor((np.arange(40 * 50 * 3) % 251).astype(np.uint8).reshape(40, 50, 3),
                       layout="HWC")
    with ndd.EvalContext() as ctx:
        angle = 10
        out = ndd.rotate(image, angle=angle, fill_value=0)
        angle = 20
        out.evaluate()
        keys = [(sorted(key[5]), sorted(dict(key[6]))) for key in ctx._instance_cache]
    return {"instances": keys, "values": values(out), "unused angle": angle}


def test_eval_context_instance_cache():
    assert_matches_eager(_instance_cache, modes=("transparent",), raises=False)


# ---------------------------------------------------------------------------------------------
# Checkpoints with readers


def _labels(labels: Any) -> list[int]:
    return np.asarray(ndd.as_tensor(labels)).reshape(-1).tolist()


def _checkpoint_mid_epoch(root: str) -> dict:
    reader = ndd.readers.File(file_root=root, random_shuffle=True, seed=3,
                              enable_checkpointing=True)
    rng = ndd.random.RNG(seed=5)
    seen, payload = [], None
    for step, (_, labels) in enumerate(reader.next_epoch(batch_size=BATCH)):
        seen.append(_labels(labels))
        ndd.random.uniform(batch_size=BATCH, shape=[2], rng=rng).evaluate()
        if step == 1:
            ckpt = ndd.checkpoint.Checkpoint()
            ckpt.register(reader, "reader")
            ckpt.register(rng, "rng")
            ckpt.collect()
            payload = ckpt.serialize()
    restored = ndd.readers.File(file_root=root, random_shuffle=True, seed=3)
    restored_rng = ndd.random.RNG(seed=99)
    ckpt2 = ndd.checkpoint.Checkpoint()
    ckpt2.deserialize(payload)
    ckpt2.register(restored, "reader")
    ckpt2.register(restored_rng, "rng")
    resumed = [_labels(labels) for _, labels in restored.next_epoch(batch_size=BATCH)]
    return {"seen": seen, "resumed": resumed, "rng": str(restored_rng.state),
            "resumes where collected": resumed == seen[2:]}


def test_checkpoint_reader_mid_epoch(jpeg_dir):
    assert_matches_eager(_checkpoint_mid_epoch, str(jpeg_dir), modes=("transparent",), raises=False)


def _checkpoint_errors(root: str) -> dict:
    def state_before_iteration() -> None:
        ndd.readers.File(file_root=root).get_state()

    def set_state_after_iteration() -> None:
        reader = ndd.readers.File(file_root=root, enable_checkpointing=True)
        next(iter(reader.next_epoch(batch_size=BATCH)))
        reader.set_state(reader.get_state())

    return {case.__name__: outcome(case)
            for case in (state_before_iteration, set_state_after_iteration)}


def test_checkpoint_errors(jpeg_dir):
    assert_matches_eager(_checkpoint_errors, str(jpeg_dir), modes=("transparent",), raises=False)


# ---------------------------------------------------------------------------------------------
# What the operator classes show while transparent mode's hooks are in place


def _operator_methods() -> dict:
    from nvidia.dali.experimental.dynamic import _ops

    import inspect

    classes = [ndd.readers.File, ndd.ExternalSource, *_ops._all_ops]
    seen = {}
    for cls in classes:
        for name in ("__call__", "next_epoch", "captured"):
            method = getattr(cls, name, None)
            if method is not None:
                seen[f"{cls.__name__}.{name}"] = (method.__name__, method.__qualname__,
                                                  method.__module__, method.__doc__,
                                                  str(inspect.signature(method)))
    return {"methods": seen}


def test_operator_methods_keep_name_docs_and_signature():
    assert_matches_eager(_operator_methods, modes=("transparent",), raises=False)


def _metadata_after_inputs_ran() -> dict:
    """An op fed by a value DALI cannot describe before it runs (a reduction of user data,
    which eager ndd runs at its call): its dtype comes from inference over the input's real
    metadata, without running the op, so the op's own error (resize rejects int64) still comes
    at first use. Found by the transparent-mode fuzzer (it raised at `.dtype`)."""
    data = [np.ones((5, 6, 3), np.int16), np.ones((2, 3, 3), np.int16)]
    summed = ndd.reductions.sum(ndd.batch(data, layout="HWC"), axes=[0], keep_dims=True)
    resized = ndd.resize(summed, size=[4, 4])
    try:
        metadata = (str(resized.dtype), resized.ndim, resized.layout)
    except Exception as error:  # noqa: BLE001
        metadata = type(error).__name__
    try:
        resized.evaluate()
        first_use = "ok"
    except Exception as error:  # noqa: BLE001
        first_use = type(error).__name__
    return {"metadata": metadata, "first use": first_use}


def test_metadata_after_inputs_ran():
    assert_matches_eager(_metadata_after_inputs_ran, modes=("transparent",), raises=False)


def _nested_list_literal() -> dict:
    """A nested list written at the call is a construction argument eagerly, and ndd's
    instance lookup cannot hash it: TypeError at the call. In a variable it is a 2-D tensor
    argument, which works."""
    image = ndd.as_batch([np.zeros((6, 7, 3), np.uint8)] * 2, layout="HWC")
    literal = outcome(lambda: ndd.warp_affine(image, matrix=[[1.0, 0, 1], [0, 1, 2]]))
    matrix = [[1.0, 0, 1], [0, 1, 2]]
    variable = values(ndd.warp_affine(image, matrix=matrix))
    return {"literal": literal, "variable": variable}


def test_nested_list_argument_literal_and_variable():
    assert_matches_eager(_nested_list_literal, modes=("transparent",), raises=False)
