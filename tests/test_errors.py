"""Errors read as eager's: the same type, text, moment (the line that raises) and RNG state
afterwards, compiled and in transparent mode; and ndd_trace changes no program's output (its
logs, the tracebacks of `python -m ndd_trace`)."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import subprocess
import sys
import textwrap
import traceback
import warnings

import numpy as np
import pytest
from conftest import subprocess_env
from harness import Compiler, Step, assert_matches_eager

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace


@contextlib.contextmanager
def _quiet_stderr():
    """DALI's decoder prints its complaints about corrupt data on the process's stderr."""
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _python(arguments: list[str], cwd, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *arguments], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=subprocess_env(**env))


# -- errors at the user's line, and the next call -----------------------------------------------

def test_a_failed_earlier_run_does_not_break_the_next_call(jpeg_bytes):
    """Found by review: a run that failed and was not consumed yet dropped the pipeline while
    the next call was being fed ('NoneType' has no attribute ...). The next call must succeed,
    and the failed result still raises when consumed."""
    import numpy as np
    from harness import assert_same

    @ndd.compile
    def decode(data):
        return ndd.resize(ndd.decoders.image(data), size=[8, 8])

    # copies (ndd.batch): data given as it is (ndd.as_batch) would fail at the call, as eagerly
    good = ndd.batch(jpeg_bytes[:2])
    bad = ndd.batch([np.frombuffer(b"\xff\xd8\xff not a jpeg" * 8, dtype=np.uint8)] * 2)
    decode(good).evaluate()  # traced and built
    failed = decode(bad)  # fails in the pipeline; not consumed yet
    result = decode(good)
    assert_same(ndd.resize(ndd.decoders.image(good), size=[8, 8]), result)
    with pytest.raises(Exception):
        failed.evaluate()


def test_user_exception_propagates_unchanged(batch):
    def failing(x):
        ndd.flip(x)
        raise KeyError("user problem")

    compiled = ndd.compile(failing)
    with pytest.raises(KeyError, match="user problem"):
        compiled(batch)
    assert compiled.cache_info().entries == 0
    with pytest.raises(KeyError):
        compiled(batch)


def test_invalid_argument_error_names_argument(batch):
    @ndd.compile
    def bad(x):
        return ndd.resize(x, size=[8, 8], interp_type="not-an-interp")

    with pytest.raises(Exception) as info:
        bad(batch)
    assert "interp_type" in str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "test_errors.py" in "".join(info.value.__notes__)
    # still usable afterwards, eagerly and compiled
    from harness import assert_same

    assert_same(ndd.flip(batch), ndd.compile(lambda x: ndd.flip(x))(batch))


def test_runtime_error_points_at_user_line():
    corrupt = ndd.as_batch([np.frombuffer(b"\xff\xd8\xff\xe0not a jpeg", dtype=np.uint8)] * 2)

    @ndd.compile
    def decode(data):
        return ndd.decoders.image(data)  # DECODE-LINE

    with pytest.raises(ndd_trace.PipelineError) as info:
        decode(corrupt).evaluate()
    frame = traceback.extract_tb(info.tb)[-1]
    assert frame.filename == __file__ and "DECODE-LINE" in frame.line
    assert info.value.op_name == "ndd.decoders.image"


def test_lambda_runtime_error_names_op_and_line(batch):
    compiled = ndd.compile(lambda x: ndd.crop(x, crop=(100, 100)))
    with pytest.raises(ndd_trace.PipelineError) as info:
        compiled(batch).evaluate()
    assert info.value.op_name == "ndd.crop" and info.value.loc is not None


# -- the program's output ------------------------------------------------------------------------

LOGGING_SCRIPT = """\
import logging, os, sys
import numpy as np
import nvidia.dali.experimental.dynamic as ndd
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s %(message)s")
if os.environ.get("CHANNEL"):
    logging.getLogger(os.environ["CHANNEL"]).setLevel(logging.INFO)

def preprocess(images):
    return ndd.flip(ndd.resize(images, size=[4, 4]), horizontal=1)

if os.environ.get("COMPILE"):
    import ndd_trace
    preprocess = ndd.compile(preprocess)
batch = ndd.as_batch([np.full((6, 8, 3), 7, np.uint8)] * 2, layout="HWC")
for step in range(2):
    logging.getLogger("train").info("step %d sum %d", step,
                                    int(np.asarray(preprocess(batch).select(0)).sum()))
"""


def test_root_logger_at_info_prints_no_ndd_trace_lines(tmp_path):
    """`logging.basicConfig(level=logging.INFO)`: the script's own lines only, plain, compiled
    and under `python -m ndd_trace`; a level set on an ndd_trace logger switches it on."""
    script = tmp_path / "train.py"
    script.write_text(LOGGING_SCRIPT)
    plain = _python([str(script)], tmp_path)
    compiled = _python([str(script)], tmp_path, COMPILE="1")
    transparent = _python(["-m", "ndd_trace", str(script)], tmp_path)
    assert plain.returncode == compiled.returncode == transparent.returncode == 0, (
        compiled.stderr + transparent.stderr)
    assert [line[:12] for line in plain.stdout.splitlines()] == ["train step 0", "train step 1"]
    assert compiled.stdout == transparent.stdout == plain.stdout
    asked = _python([str(script)], tmp_path, COMPILE="1", CHANNEL="ndd_trace.builds")
    assert "ndd_trace.builds built" in asked.stdout and "ndd_trace.trace" not in asked.stdout
    everything = _python([str(script)], tmp_path, COMPILE="1", CHANNEL="ndd_trace")
    assert "ndd_trace.trace" in everything.stdout and "ndd_trace.builds" in everything.stdout
    by_environment = _python([str(script)], tmp_path, COMPILE="1", NDD_TRACE_LOGS="builds")
    assert by_environment.stdout == plain.stdout
    assert "[ndd_trace.builds] built" in by_environment.stderr


# -- tracebacks under python -m ndd_trace --------------------------------------------------------

@pytest.mark.parametrize("body", [
    'def configure():\n    raise ValueError("bad config")\n\nconfigure()\n',
    "raise KeyboardInterrupt\n",
    'import sys\nsys.excepthook = lambda kind, value, tb: print("hook", len(__import__('
    '"traceback").extract_tb(tb)), file=sys.stderr)\nraise KeyError(1)\n',
], ids=["error", "keyboard-interrupt", "own-excepthook"])
def test_uncaught_error_prints_as_a_plain_run(tmp_path, body):
    """The whole stderr and the exit status of `python -m ndd_trace script.py` are those of
    `python script.py`: no runpy or ndd_trace frames, the script by its absolute path."""
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "boom.py").write_text("import numpy as np\nimport nvidia.dali.experimental."
                                    "dynamic as ndd\nx = ndd.as_batch([np.zeros(3)])\n" + body)
    plain = _python([os.path.join("app", "boom.py")], tmp_path)
    traced = _python(["-m", "ndd_trace", os.path.join("app", "boom.py")], tmp_path)
    assert plain.returncode != 0
    assert (traced.returncode, traced.stderr) == (plain.returncode, plain.stderr)
    assert "<frozen runpy>" not in traced.stderr


def test_uncaught_error_of_a_module_prints_as_python_m(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text("def run():\n    raise KeyError('missing')\n\nrun()\n")
    plain = _python(["-m", "pkg.main"], tmp_path)
    traced = _python(["-m", "ndd_trace", "-m", "pkg.main"], tmp_path)
    assert (traced.returncode, traced.stderr) == (plain.returncode, plain.stderr) != (0, "")


def test_script_globals_and_sys_path_as_python_gives_them(tmp_path):
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "probe.py").write_text(textwrap.dedent('''\
        """The probe."""
        import sys
        print(sorted((k, type(v).__name__) for k, v in globals().items()))
        print(__file__, __doc__, sys.argv, sys.path[0], sys.path.count(sys.path[0]))
        print(sys.modules["__main__"].__dict__ is globals(), __loader__.name)
        x: int = 1
        print(__annotations__)
        '''))
    plain = _python([os.path.join("app", "probe.py"), "--flag"], tmp_path)
    traced = _python(["-m", "ndd_trace", os.path.join("app", "probe.py"), "--flag"], tmp_path)
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout
    assert str(folder) in plain.stdout


# -- a call DALI rejects, in transparent mode ----------------------------------------------------

def _rejected_call() -> tuple:
    try:
        ndd.resize(ndd.tensor([[1]]), size=[-5, 2])  # a 2-D input: no layout resize takes
    except Exception as error:  # noqa: BLE001 (compared with the other mode's)
        frames = [(os.path.basename(frame.filename).split("-")[0], frame.name, frame.lineno)
                  for frame in traceback.extract_tb(error.__traceback__)]
        return type(error), str(error), error.__context__, error.__cause__, frames
    return ("no error",)


def test_rejected_call_raises_as_eagerly_without_internal_context():
    """The same exception, text and traceback (the eager call's frames only), and no internal
    exception chained as its context."""
    eager = _rejected_call()
    with ndd_trace.enabled():
        transparent = _rejected_call()
    assert eager[0] is ValueError and eager[2] is None
    assert transparent == eager


# -- run-time errors: type, text, moment, RNG ----------------------------------------------------

def _chain(error: BaseException | None) -> list[tuple[str, str]]:
    """The exception and its causes: (built-in type name, text), outermost first."""
    chain = []
    while error is not None:
        builtin = next(cls for cls in type(error).__mro__ if cls.__module__ == "builtins")
        chain.append((builtin.__name__, str(error)))
        error = error.__cause__
    return chain


# a scenario `scenario(wrap)` eagerly, with `wrap` compiling (mode step) and in transparent mode
THREE_WAYS = {"modes": ("step", "transparent"), "seed": 7, "warn": "ignore"}


def _not_an_image() -> ndd.Batch:
    return ndd.as_batch([np.arange(100, dtype=np.uint8)] * 2)  # user data, not image bytes


def _decode_at_call(wrap):
    def prep(data):
        images = ndd.decoders.image(data)  # DECODE
        angle = ndd.random.uniform(batch_size=images.batch_size, range=[-10, 10])
        return ndd.rotate(ndd.resize(images, size=[8, 8]), angle=angle)

    prep = wrap(prep)
    try:
        out = prep(_not_an_image())
    except Exception as error:  # noqa: BLE001 (compared with the other modes')
        lines = [frame.line for frame in traceback.extract_tb(error.__traceback__)
                 if frame.filename == __file__]
        return "at call", _chain(error), lines[-1]
    try:
        out.evaluate()
    except Exception as error:  # noqa: BLE001
        return "at use", _chain(error)
    return ("no error",)


def test_decode_error_on_user_data_raises_at_the_call_as_eagerly():
    """Decoding user bytes that are not an image: eager ndd runs the decoder at the call and
    raises DALI's own error there; so do compiled functions and transparent mode (same type
    and text, traceback ending at the decoder's line), and the random op after it draws
    nothing."""
    eager = assert_matches_eager(_decode_at_call, Compiler(), **THREE_WAYS)["eager"].result
    assert eager[0] == "at call" and eager[1][0][0] == "RuntimeError", eager
    assert "DECODE" in eager[2]


def _decode_or_skip(wrap, batches):
    def step(jpegs):
        images = ndd.decoders.image(jpegs)
        angle = ndd.random.uniform(batch_size=images.batch_size, range=[-30, 30])
        return ndd.rotate(images, angle=angle, fill_value=0)

    step = wrap(step)
    seen = []
    for batch in batches:  # a loop that skips the batches it cannot decode
        try:
            out = step(ndd.as_batch(batch))
            seen.append([np.asarray(out.select(i)).tobytes() for i in range(out.batch_size)])
        except Exception as error:  # noqa: BLE001
            seen.append(_chain(error))
    return seen


def test_random_ops_after_a_caught_decode_error_as_eagerly(jpeg_bytes):
    """The same values at every step after a batch that fails to decode: the random op after
    the decoder never drew for it, as eagerly."""
    good = [np.frombuffer(data, dtype=np.uint8) for data in jpeg_bytes[:2]]
    corrupt = np.frombuffer(b"\xff\xd8\xff\xe0 this is not a jpeg" * 4, dtype=np.uint8)
    batches = [good, [good[0], corrupt], good, good]
    with _quiet_stderr():
        runs = assert_matches_eager(_decode_or_skip, Compiler(), batches, **THREE_WAYS)
    raised = runs["eager"].result[1][0]  # the second step raised: (type, text), not bytes
    assert len(raised) == 2 and all(isinstance(part, str) for part in raised)


def test_a_loop_that_skips_failing_batches_is_not_rebuilt_at_every_failure(jpeg_bytes):
    """A loop that catches a failing batch every third step: the same values and errors as
    eagerly in every mode, and the pipeline is not built again after each failure (the calls
    after a failed run run eagerly, one after the first, twice as many after each failure that
    follows closely)."""
    good = [np.frombuffer(data, dtype=np.uint8) for data in jpeg_bytes[:2]]
    corrupt = np.frombuffer(b"\xff\xd8\xff\xe0 this is not a jpeg" * 4, dtype=np.uint8)
    batches = [good, good, [good[0], corrupt]] * 6
    with _quiet_stderr():
        assert_matches_eager(_decode_or_skip, Compiler(), batches, **THREE_WAYS)
        builds = []

        def count_builds(step):
            compiled = ndd_trace.compile(step)
            builds.append(compiled)
            return compiled

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _decode_or_skip(count_builds, batches)
    executable = builds[0].entries[0].executable
    # without the eager calls: built 7 times (once, then after each of 6 failures)
    assert executable.builds <= 4 and executable.backoff.failures <= 4, executable.builds


@pytest.mark.parametrize("mode", ["compiled", "transparent"])
def test_a_caught_decode_error_leaves_the_decoder_for_the_next_call_as_eagerly(
        jpeg_bytes, monkeypatch, mode):
    """Eager ndd hands a failed call's operator instance back to its cache when the error is
    dropped, and the next call reuses it; ndd_trace's failure path once held it in reference
    cycles (tracebacks whose frames held the error) until a garbage collection, so the next
    call made a new decoder (on an H100, ~270 ms a failing step)."""
    from nvidia.dali.experimental.dynamic import _ops
    made = []
    original = _ops.Operator.__init__

    def counted(self, *args, **kwargs):
        made.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(_ops.Operator, "__init__", counted)
    good = ndd.as_batch([np.frombuffer(data, dtype=np.uint8) for data in jpeg_bytes[:2]])
    corrupt = ndd.as_batch([np.frombuffer(b"not a jpeg", dtype=np.uint8)] * 2)

    def step(jpegs):
        return ndd.flip(ndd.decoders.image(jpegs), horizontal=1)

    def loop(call):
        for i in range(12):
            try:
                np.asarray(call(corrupt if i % 3 == 2 else good).select(0))
            except RuntimeError:
                pass
        return sum("Image" in name for name in made)

    gc.disable()  # (what a collection would free is not counted on)
    try:
        with ndd.EvalContext():  # (its own cache of operator instances: eager makes one)
            eager = loop(step)
            made.clear()
            with _quiet_stderr(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if mode == "compiled":
                    mine = loop(ndd_trace.compile(step))
                else:
                    with ndd_trace.enabled():
                        mine = loop(step)
    finally:
        gc.enable()
    assert eager == 1 and mine == 0, (eager, mine)


def _variants_drawn(wrap, sequence, good, corrupt):
    def step(jpegs, k):
        images = ndd.decoders.image(jpegs)
        angle = ndd.random.uniform(batch_size=images.batch_size, range=[-30, 30])
        return ndd.rotate(images, angle=angle * k, fill_value=0)  # (k: a variant per value)

    step = wrap(step)
    seen = []
    for k in sequence:  # k < 0: a batch that fails to decode, caught
        try:
            out = step(ndd.as_batch(corrupt if k < 0 else good), abs(k))
            seen.append([np.asarray(out.select(i)).tobytes() for i in range(out.batch_size)])
        except Exception as error:  # noqa: BLE001
            seen.append(_chain(error))
    return seen


@pytest.mark.parametrize("seed", range(8))
def test_variants_drawn_at_random_with_caught_failures_as_eagerly(jpeg_bytes, seed):
    """What changes between calls, drawn at random: new variants past the first four (run
    eagerly until seen again), repeats, and failing batches caught (eager calls after a failed
    run): every call's values and errors and the generator's state afterwards as eager's."""
    import random as python_random
    draw = python_random.Random(seed)
    sequence = [draw.choice([1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -5]) for _ in range(32)]
    good = [np.frombuffer(data, dtype=np.uint8) for data in jpeg_bytes[:2]]
    corrupt = [good[0], np.frombuffer(b"\xff\xd8\xff\xe0 not a jpeg" * 4, dtype=np.uint8)]
    with _quiet_stderr():
        assert_matches_eager(_variants_drawn, Compiler(), sequence, good, corrupt, **THREE_WAYS)


def _grown_batch(wrap):
    def f(x):
        return x + ndd.random.uniform(batch_size=x.batch_size, range=[0, 1], shape=[2])

    f = wrap(f)
    seen = []
    for x in (ndd.as_batch([np.zeros((3, 2), np.float32)] * 2),
              ndd.as_batch([np.zeros((3, 5), np.float32)] * 4)):  # larger, cannot broadcast
        try:
            out = f(x)
            seen.append(np.asarray(out.select(0)).tobytes())
        except Exception as error:  # noqa: BLE001
            seen.append(_chain(error))
    return seen


def test_error_after_the_batch_grows_as_eagerly():
    """A broadcast error on a call larger than the first: eager's RuntimeError and text, not
    the error of a re-run at the first call's batch size."""
    eager = assert_matches_eager(_grown_batch, Compiler(), **THREE_WAYS)["eager"].result
    assert eager[1][0][0] == "RuntimeError", eager


def _masked(wrap):
    x = ndd.as_batch([np.ones((4, 4, 3), np.int32)], layout="HWC")

    def f(x):
        y = ndd.resize(x, size=[6, 6])  # FIRST: int32, rejected when it runs
        return ndd.resize(ndd.tensor([[1]]), size=[2, 2]), y  # rejected at the call

    try:
        wrap(f)(x)
    except Exception as error:  # noqa: BLE001
        lines = [frame.line for frame in traceback.extract_tb(error.__traceback__)
                 if frame.filename == __file__]
        return _chain(error), lines[-1]
    return ("no error",)


def test_error_at_a_call_is_not_masked_by_a_later_calls_error():
    """Eager ndd raises the first call's run-time error (it runs at the call: user data), and
    never reaches the second call, which DALI would reject: so does ndd_trace."""
    eager = assert_matches_eager(_masked, Compiler(), **THREE_WAYS)["eager"].result
    assert "FIRST" in eager[1] and "int32" in eager[0][0][1]


def _used_later(wrap):
    def crop(x):
        return ndd.crop(x, crop=(20, 20))  # larger than the data: fails when it runs

    crop = wrap(crop)
    data = ndd.zeros(shape=(10, 10, 3), batch_size=2)  # an op's result: not run at the call
    seen = []
    for use in ("evaluate", "select", "torch"):
        out = crop(data)
        try:
            if use == "evaluate":
                out.evaluate()
            elif use == "select":
                np.asarray(out.select(0))
            else:
                out.torch(pad=True)
        except Exception as error:  # noqa: BLE001
            seen.append((use, _chain(error)[-2:]))
    return seen


def test_error_of_a_result_used_later_reads_as_eagers():
    """An op that fails when it runs, its result used later: eager's "An error happened during
    asynchronous execution", caused by DALI's own error (same types, same texts)."""
    eager = assert_matches_eager(_used_later, Compiler(), **THREE_WAYS)["eager"].result
    assert tuple(eager[0][1][0]) == ("RuntimeError",
                                     "An error happened during asynchronous execution")


def _some_fail(wrap):
    def augment(images):
        flipped = ndd.flip(images, horizontal=1)
        noisy = ndd.cast(images, dtype=ndd.float32) + ndd.random.uniform(
            batch_size=images.batch_size, range=[0, 10], shape=[20, 30, 3])
        matrix = ndd.random.uniform(batch_size=images.batch_size, range=[0, 1], shape=[6])
        warped = ndd.warp_affine(images, matrix=matrix, size=[10, 10])  # needs [2, 3]: fails
        return flipped, warped, noisy, ndd.flip(warped)

    augment = wrap(augment)
    images = ndd.flip(ndd.as_batch([np.full((20, 30, 3), i, np.uint8) for i in range(4)],
                                   layout="HWC"), vertical=1)  # an op's result: not run yet
    seen = []
    for order in ((0, 1, 2, 3), (1, 0, 3, 2)):  # a failing result read first, or last
        outputs = augment(images)
        for index in order:
            try:
                seen.append((index, np.asarray(outputs[index].torch()).tobytes()))
            except Exception as error:  # noqa: BLE001
                seen.append((index, _chain(error)[-2:]))
    return seen


def test_only_the_results_that_use_a_failing_op_raise_as_eagerly():
    """A call whose ops include one that fails when it runs: eager raises for the results that
    use it (when first used), and gives the others, random ones included; so do a compiled
    function and transparent mode (a failed pipeline run failed all of its outputs)."""
    eager = assert_matches_eager(_some_fail, Compiler(), **THREE_WAYS)["eager"].result
    assert [index for index, seen in eager if isinstance(seen, bytes)] == [0, 2, 0, 2]


def _some_fail_returning_an_argument(wrap):
    def step(images, labels):
        crop = ndd.crop(ndd.flip(images, horizontal=1), crop=[20, 20],
                        out_of_bounds_policy="error")  # the images are 10x12: fails
        drawn = ndd.random.uniform(batch_size=images.batch_size)
        return crop, labels, drawn

    step = wrap(step)
    images = ndd.as_batch([np.full((10, 12, 3), i, np.uint8) for i in range(2)], layout="HWC")
    labels = ndd.as_batch([np.array([i], np.int32) for i in range(2)])
    seen = []
    for _ in range(3):
        crop, given, drawn = step(images, labels)
        for output in (drawn, given, crop):
            try:
                seen.append(np.asarray(output.torch()).tobytes())
            except Exception as error:  # noqa: BLE001
                seen.append(_chain(error)[-2:])
    return seen


def test_a_failing_op_leaves_the_arguments_returned_and_other_results_readable():
    """Found by the twenty-fourth session's sweep: a step returning one of its arguments as it
    was given (labels beside the augmented images), whose crop fails when it runs: eager
    gives the random draw and the labels and fails the crop alone; ndd_trace failed every
    output (the argument returned as given stopped the search for the unaffected ones)."""
    eager = assert_matches_eager(_some_fail_returning_an_argument, Compiler(),
                                 **THREE_WAYS)["eager"].result
    assert [isinstance(seen, bytes) for seen in eager] == [True, True, False] * 3


def test_pipeline_error_names_the_op_and_line_in_a_note():
    prep = ndd.compile(lambda data: ndd.decoders.image(data))
    with _quiet_stderr(), pytest.raises(ndd_trace.PipelineError) as info:
        prep(_not_an_image())
    error = info.value
    assert isinstance(error, RuntimeError) and error.op_name == "ndd.decoders.image"
    assert error.__cause__ is None and error.__context__ is None
    notes = "\n".join(error.__notes__)
    assert "ndd.decoders.image" in notes and f"{os.path.basename(__file__)}:" in notes
    assert "Critical error in pipeline" in str(error.dali_error)


def _zero_byte_file_loop(root):
    reader = ndd.readers.File(file_root=root)
    seen = []
    for epoch in range(2):
        step = 0
        try:
            for jpegs, _ in reader.next_epoch(batch_size=4):
                ndd.decoders.image(jpegs).torch(pad=True)
                step += 1
        except Exception as error:  # noqa: BLE001
            seen.append((epoch, step, _chain(error)))
    return seen


def test_reader_error_in_transparent_mode_reads_as_eagers(jpeg_dir, tmp_path):
    """A plain reader loop (nothing compiled) over a folder with an empty file: the same step,
    type and text (DALI's own, no pipeline framing or C++ context) in transparent mode."""
    root = tmp_path / "photos"
    shutil.copytree(jpeg_dir, root)
    victim = sorted(p for p in root.rglob("*.jpg"))[5]
    victim.write_bytes(b"")
    plain = _zero_byte_file_loop(str(root))
    with ndd_trace.enabled():
        traced = _zero_byte_file_loop(str(root))
    assert plain and "File mapping failed" in plain[0][2][0][1]
    assert traced == plain


def _two_sites(jpeg_bytes):
    good = ndd.as_batch([np.frombuffer(data, dtype=np.uint8) for data in jpeg_bytes[:2]])
    ndd.decoders.image(good).evaluate()  # a region of this structure, made at this line
    try:
        ndd.decoders.image(_not_an_image())  # SECOND SITE
    except Exception as error:  # noqa: BLE001
        return _chain(error), [frame.line for frame in traceback.extract_tb(error.__traceback__)
                               if frame.filename == __file__][-1]
    return None


def test_error_names_the_line_of_this_call_not_of_the_region_first_made(jpeg_bytes):
    """Transparent mode reuses a region made at another line: its error is at this call."""
    eager = _two_sites(jpeg_bytes)
    with _quiet_stderr(), ndd_trace.enabled():
        transparent = _two_sites(jpeg_bytes)
    assert "SECOND SITE" in eager[1] and transparent == eager


def _pipeline_error() -> ndd_trace.PipelineError:
    prep = ndd.compile(lambda data: ndd.decoders.image(data))
    with _quiet_stderr(), pytest.raises(ndd_trace.PipelineError) as info:
        prep(_not_an_image())
    return info.value


def test_errors_pickle_as_they_were_made():
    """multiprocessing and DataLoader workers pickle exceptions: each comes back whole."""
    import pickle

    from ndd_trace.core.source import SourceLoc

    loc = SourceLoc("train.py", 12, "step")
    made = [ndd_trace.GraphBreakError("reads `.shape` of a traced value", loc, "step"),
            ndd_trace.PerSampleError("calls a stateful operator", loc),
            ndd_trace.ExportError("cannot be exported{where}", loc, node=object()),
            ndd_trace.LoopError("reader `File` cannot go on"),
            _pipeline_error()]
    for error in made:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert getattr(back, "loc", None) == getattr(error, "loc", None)
        assert getattr(back, "__notes__", None) == getattr(error, "__notes__", None)
    assert type(made[-1]).__name__ == "RuntimeError"
    assert type(made[-1]) is ndd_trace.PipelineError.RuntimeError


def test_pipeline_error_type_is_found_by_name_in_a_fresh_process():
    import pickle

    data = pickle.dumps(_pipeline_error())
    check = ("import pickle, sys, ndd_trace; e = pickle.loads(sys.stdin.buffer.read()); "
             "print(type(e).__name__, isinstance(e, RuntimeError), "
             "isinstance(e, ndd_trace.PipelineError), e.op_name)")
    done = subprocess.run([sys.executable, "-c", check], input=data, capture_output=True,
                          env=subprocess_env(), timeout=120)
    assert done.stdout.decode().split() == ["RuntimeError", "True", "True", "ndd.decoders.image"], (
        done.stderr.decode())


def test_dataloader_worker_hands_a_pipeline_error_to_the_main_process():
    """torch sends a worker's exception type by name to the main process, which raises it
    again: the type eager would send (RuntimeError) is what the loop catches, as ndd_trace's."""
    import torch

    error = _pipeline_error()

    class Failing(torch.utils.data.Dataset):  # its items raise what a pipeline raised
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int):
            raise error

    # a type pickle cannot find hangs the loop: the worker's queue thread fails, the worker
    # lives on, the main process waits (the timeout makes that a failure here)
    loader = torch.utils.data.DataLoader(Failing(), num_workers=1, multiprocessing_context="fork",
                                         timeout=60)
    with pytest.raises(RuntimeError) as info:
        next(iter(loader))
    assert isinstance(info.value, ndd_trace.PipelineError)  # not "worker exited unexpectedly"
    assert "in DataLoader worker process 0" in str(info.value) and str(error) in str(info.value)


def test_trace_and_build_logs_carry_their_times():
    """The first batch's phases, for a handler of the user's own (bench_ops prints them)."""
    import logging

    times: dict = {}

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            times.update(getattr(record, "ndd_trace_ms", {}))

    handler = Collect()
    loggers = [logging.getLogger(f"ndd_trace.{name}") for name in ("trace", "builds")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        step = ndd.compile(lambda x: ndd.flip(x, horizontal=1))
        step(ndd.as_batch([np.zeros((4, 4, 3), np.uint8)] * 2, layout="HWC")).evaluate()
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(handler)
            logger.setLevel(level)
    assert set(times) == {"trace", "code", "build"} and all(ms >= 0 for ms in times.values())


def test_an_uncaught_pipeline_error_ends_its_traceback_as_eager_does():
    """The last line of the traceback reads `RuntimeError: <DALI's text>`, as eager's (issue 35:
    it read `ndd_trace.PipelineError.RuntimeError: ...`); the type still pickles by itself."""
    import pickle
    import traceback

    error = _pipeline_error()
    last = traceback.format_exception_only(type(error), error)[0]
    assert last.startswith("RuntimeError: ") and str(error) in last
    assert pickle.loads(pickle.dumps(type(error))) is type(error)


def test_a_numpy_array_for_a_fixed_argument_raises_eagers_type_error(batch):
    """`axes=np.array([1])` (not a tensor argument): eager raises TypeError at the call, its
    operator-instance key being unhashable; so does the compiled function (issue 35: it turned
    the array into a list and returned values)."""
    def mean(x):
        return ndd.reductions.mean(x, axes=np.array([1]))

    with pytest.raises(TypeError) as eager:
        mean(batch)
    with pytest.raises(TypeError) as compiled:
        ndd.compile(mean)(batch)
    assert str(compiled.value) == str(eager.value) == "unhashable type: 'numpy.ndarray'"


def _sum_over_a_missing_axis(wrap):
    def total(x):
        return ndd.reductions.sum(x, axes=[3])  # the images have 3 dims: no axis 3

    total = wrap(total)
    images = ndd.as_batch([np.zeros((4, 5, 3), np.uint8)], layout="HWC")
    seen = []
    for data in [images] * 4 + [images + 0] * 2:  # user data (runs at the call), then not
        try:
            out = total(data)
        except Exception as error:  # noqa: BLE001 (compared with the other modes')
            seen.append(("at call", _chain(error)))
            continue
        try:
            out.evaluate()
        except Exception as error:  # noqa: BLE001
            seen.append(("at use", _chain(error)))
    return seen


def test_the_same_failure_reads_as_eagers_after_its_pipeline_is_given_up():
    """A call that fails every time: after three failures its pipeline is given up and the
    call runs eagerly, and its error still reads as eager's (issue 35: its text became "An
    error happened during asynchronous execution" at the call), at the call for user data, at
    the first use of the result otherwise."""
    eager = assert_matches_eager(_sum_over_a_missing_axis, Compiler(), **THREE_WAYS)["eager"].result
    assert eager[0] == ("at call", [("IndexError",
                                        "Axis index out of range: 3 not in range [-3,2]")])
    assert eager[-1][0] == "at use" and len(eager[-1][1]) == 2


def _resize_a_total(wrap, derived):
    def f(x):
        total = ndd.reductions.sum(x + 1 if derived else x)  # a 0-d result
        return ndd.resize(total, size=[3, 4])  # REJECTED: resize takes no 0-d input

    images = ndd.as_batch([np.arange(24, dtype=np.uint8).reshape(2, 4, 3)] * 2, layout="HWC")
    try:
        out = wrap(f)(images)
    except Exception as error:  # noqa: BLE001 (compared with the other modes')
        lines = [frame.line for frame in traceback.extract_tb(error.__traceback__)
                 if frame.filename == __file__]
        return "at call", _chain(error), lines[-1]
    try:
        np.asarray(out.select(0))
    except Exception as error:  # noqa: BLE001
        return "at use", _chain(error)
    return ("no error",)


@pytest.mark.parametrize("derived", [False, True])
def test_a_layout_error_on_an_input_of_unknown_ndim_raises_at_the_call(derived):
    """An op given the 0-d result of a reduction (whose ndim DALI cannot infer before it runs):
    eager checks the call with its input run, and raises ValueError at the call; so do the
    compiled function (issue 35: it raised at the first use of the result, as "An error
    happened during asynchronous execution") and transparent mode."""
    eager = assert_matches_eager(_resize_a_total, Compiler(), derived, **THREE_WAYS)["eager"].result
    assert eager[0] == "at call" and eager[1][0][0] == "ValueError", eager
    assert "REJECTED" in eager[2]


def _bool_image_resized(wrap):
    """DALI's own test of the cause's text and line (test_exceptions.py), on the CPU: the same
    failing call in several places and EvalModes, so that its pipeline is given up midway."""
    def resize(image):
        return ndd.resize(image, size=(50, 50))  # RESIZE: no bool images

    resize = wrap(resize)
    seen = []
    for mode in [ndd.EvalMode.deferred, ndd.EvalMode.eager] * 3:
        with mode:
            try:
                resize(ndd.zeros(shape=(100, 100, 3), dtype=ndd.bool)).evaluate()
            except Exception as error:  # noqa: BLE001
                cause = error.__cause__ if error.__cause__ is not None else error
                last = traceback.extract_tb(cause.__traceback__)[-1].line
                seen.append((mode.name, _chain(error), last))
    return seen


def test_a_failed_call_names_its_own_line_in_every_eval_mode():
    eager = assert_matches_eager(_bool_image_resized, Compiler(), **THREE_WAYS)["eager"].result
    assert all("RESIZE" in line for *_, line in eager) and len(eager) == 6


def _resize_the_max_of_each(wrap):
    def f(x):
        return ndd.resize(ndd.reductions.max(x + 1, axes=[0]), size=[2, 2])

    f = wrap(f)
    seen = []
    for shape in [(2, 4, 4, 3)] * 3 + [(4, 4, 3)] * 2 + [(2, 4, 4, 3)]:  # 3-D, then 2-D maxima
        try:
            out = f(ndd.as_batch([np.ones(shape, np.float32)] * 2))
        except Exception as error:  # noqa: BLE001
            seen.append(("at call", _chain(error)))
            continue
        seen.append(("values", np.asarray(out.select(0)).tolist()))
    return seen


def test_a_call_accepted_before_is_checked_again_for_other_data():
    """The check eager makes at the call is made once for data of one kind (no wait at later
    calls), and again for other data: the 2-D maxima are rejected at the call, and the 3-D ones
    after them accepted, as eagerly."""
    eager = assert_matches_eager(_resize_the_max_of_each, Compiler(), **THREE_WAYS)["eager"].result
    assert [moment for moment, _ in eager] == ["values"] * 3 + ["at call"] * 2 + ["values"]


BACKGROUND = ndd.as_batch([np.zeros((4, 5, 2), np.uint8)] * 2, layout="HWC")  # 2 channels


def _decodes_its_own_bytes(x):
    noise = ndd.random.uniform(batch_size=x.batch_size, range=[0, 1])
    junk = ndd.as_batch([np.frombuffer(b"not a jpeg" * 8, np.uint8)] * x.batch_size)
    return ndd.decoders.image(junk), noise, ndd.random.coin_flip(batch_size=x.batch_size)


def _adds_a_global_batch(x):
    noise = ndd.random.uniform(batch_size=x.batch_size, range=[0, 1])
    blended = ndd.flip(x, horizontal=1) + BACKGROUND  # 3 channels + 2: cannot broadcast
    return blended, noise, ndd.random.coin_flip(batch_size=x.batch_size)


@pytest.mark.parametrize("step", [_decodes_its_own_bytes, _adds_a_global_batch])
def test_an_op_given_user_data_the_function_holds_raises_at_the_call(step):
    """Data the function makes with `ndd.as_batch(arrays)`, or reads from a global made so:
    eager runs the op given it at the call, and raises its error there (the op's own text; the
    random op after it draws nothing), call after call; so does the compiled function
    (found by a new-user probe: it raised at the first use, "An error happened during
    asynchronous execution")."""
    images = ndd.as_batch([np.zeros((4, 5, 3), np.uint8)] * 2, layout="HWC")
    with _quiet_stderr():
        assert_matches_eager(step, images, modes=("compiled", "transparent"), calls=3,
                             stop_on_error=False, warn=None)


def _crop_or_keep(images):
    """A failure eager raises at the call (user data), handled by the function's own `try`."""
    try:
        images = ndd.crop(images, crop=[30, 30], out_of_bounds_policy="error")
    except RuntimeError:
        pass  # (too small to crop: kept as it is)
    mirror = ndd.random.coin_flip(batch_size=images.batch_size)
    return ndd.flip(images, horizontal=mirror)


def _crop_in_a_guarded_helper(images):
    with contextlib.suppress(RuntimeError):
        return ndd.cast(_crop_in_a_helper(images, 30), dtype=ndd.float32)
    return ndd.cast(images, dtype=ndd.float32)


@pytest.mark.parametrize("body", [_crop_or_keep, _crop_in_a_guarded_helper],
                         ids=["try-except", "with-suppress-around-a-helper"])
def test_a_failure_at_the_call_inside_the_functions_own_try_is_handled_by_it(body):
    """Found by this session's sweep: an op given user data fails at the call in eager ndd,
    inside the function, where its `try` handles it; a compiled function raised it at the call
    to the function instead (and every other call ran eagerly after the failure, so calls
    alternated between raising and not). Such a call now runs eagerly, values and the random
    generator's state as eager's, and says so."""
    images = ndd.as_batch([np.zeros((20, 20, 3), np.uint8)] * 2, layout="HWC")
    with _quiet_stderr():
        assert_matches_eager(body, images, modes=("compiled", "transparent"), calls=4,
                             warn="ignore", raises=False)


def _transpose_rejected(images):
    """A call DALI rejects when it builds the operator (`perm` is no permutation)."""
    return ndd.transpose(images, perm=[0, 0, 1])


def _texts_of_rejected_calls_in_order(step, order, keep_errors):
    """The first lines of a rejected call's errors, given in `order` the user's batch ("user",
    failing at the call) or a DALI-owned copy ("owned", failing at the result's use). With
    the garbage collector off: a deferred failure's instance waits for a collection, eagerly
    too, so a collection in between would decide the text."""
    images = ndd.as_batch([np.zeros((4, 4, 3), np.uint8)] * 2, layout="HWC")
    errors = []
    gc.collect()
    gc.disable()
    try:
        with ndd.EvalContext():
            for given in order:
                try:
                    step(images if given == "user" else ndd.copy(images).evaluate()).evaluate()
                except RuntimeError as error:
                    errors.append(error if keep_errors else str(error).splitlines()[0])
    finally:
        gc.enable()
    return [str(error).splitlines()[0] for error in errors]


def test_a_call_rejected_at_operator_construction_called_again_as_eagerly():
    """Eager's second error reads 'Argument with name "num_threads" already exists' (DALI's
    operator cache keeps the instance whose construction failed, and its next call adds
    num_threads again); ndd_trace repeated the first one, from the op-by-op replay that finds
    the failed op, whose call built its operator anew (found by a new-user probe as
    probe5/13). The interpreted run's own error is now raised."""
    assert_matches_eager(_texts_of_rejected_calls_in_order, Step(_transpose_rejected),
                         ("user", "user"), False, modes=("step", "transparent"), warn="ignore")


def test_rejected_calls_whose_errors_are_kept_each_fail_anew_as_eagerly():
    """Eager's errors are all the construction's own (each kept error holds its call's operator
    instance, so the next call builds one anew); ndd_trace's third read 'Argument with name
    "num_threads" already exists' (found by the twenty-fifth session's error-path sweep, p14):
    the op-by-op replay that finds the failed op freed its call at once, putting its instance
    back in the cache. The raised error now holds the replay's failed calls."""
    assert_matches_eager(_texts_of_rejected_calls_in_order, Step(_transpose_rejected),
                         ("user",) * 3, True, modes=("step", "transparent"), warn="ignore")


def _normalized_steps(batches):
    """Each batch normalized with a 3-channel mean written at the call (`stddev=2.0`: a
    construction argument), a failure caught and the loop going on."""
    seen = []
    for images in batches:
        try:
            x = ndd.normalize(ndd.cast(images, dtype=ndd.float32),
                              mean=np.full((1, 1, 3), 5, np.float32), stddev=2.0)
            seen.append(float(np.asarray(x.select(0)).sum()))
        except RuntimeError as error:
            seen.append(str(error.__cause__).splitlines()[0])
    return seen


def test_a_failed_runs_eager_replay_passes_arguments_as_the_users_call_site_does():
    """A step that fails (a 1-channel batch given a 3-channel mean), caught, then valid steps:
    each raises or gives what eager's does (found by the twenty-second session's sweep: the
    replay of a failed region called the op from a line of ndd_trace's, where eager reads no
    argument as written at the call, so `stddev=2.0` went per call: a different error, and the
    valid steps after it failed too, through the operator eager's cache kept from it)."""
    rng = np.random.default_rng(4)
    rgb = ndd.as_batch([rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)] * 2, layout="HWC")
    gray = ndd.as_batch([rng.integers(0, 256, (8, 8, 1), dtype=np.uint8)] * 2, layout="HWC")
    assert_matches_eager(_normalized_steps, [rgb, gray, rgb, gray, rgb, gray, rgb, rgb],
                         modes=("transparent",), warn="ignore")


def test_a_call_whose_pipeline_cannot_be_built_raises_eagers_error_with_no_context():
    """Found by this session's sweep: the first call ran eagerly inside the handler of the
    failed build, so its error's `__context__` was the build's failure ("During handling of
    the above exception, another exception occurred"), where eager's has none."""
    images = ndd.as_batch([np.zeros((4, 4, 3), np.uint8)] * 2, layout="HWC")
    contexts = []
    with _quiet_stderr():
        for step in (_transpose_rejected, ndd_trace.compile(_transpose_rejected)):
            try:
                step(images).evaluate()
            except RuntimeError as error:
                contexts.append(error.__context__)
    assert contexts == [None, None], contexts


def _user_frames_of(step, data):
    """The traceback of a failing decode, this file's frames only (with their source line and
    carets), as printed."""
    try:
        step(data).evaluate()
    except RuntimeError:
        printed = traceback.format_exc().splitlines()
    kept, ours = [], False
    for line in printed:
        if line.startswith("  File "):
            ours = __file__ in line
            if ours:
                kept.append(line.split(", ", 1)[1])
        elif ours and line.startswith("    "):
            kept.append(line)
    return kept


def _decode_in_a_step(jpegs):
    images = ndd.decoders.image(jpegs)  # the failing call
    return ndd.resize(images, size=[8, 8])


def test_a_run_error_traceback_shows_the_users_call_as_eagerly():
    """Found by the session's differential sweep: a compiled function's traceback put its
    carets under the line's first 25 columns (not under the call), and transparent mode showed
    the user's line twice (a made-up frame for it, beside its own)."""
    data = ndd.as_batch([np.arange(100, dtype=np.uint8)] * 2)
    with _quiet_stderr():
        eager = _user_frames_of(_decode_in_a_step, data)
        compiled = _user_frames_of(ndd_trace.compile(_decode_in_a_step), data)
        with ndd_trace.enabled():
            transparent = _user_frames_of(_decode_in_a_step, data)
    assert any("^^^^" in line for line in eager), eager
    assert compiled == eager and transparent == eager, (eager, compiled, transparent)


def test_an_error_raised_again_at_one_line_shows_the_same_traceback():
    """The frame that claims the user's line is made once a line and kept: the second and
    third failures there print as the first, as eager's do, in every mode."""
    data = ndd.as_batch([np.arange(100, dtype=np.uint8)] * 2)
    compiled_step = ndd_trace.compile(_decode_in_a_step)
    with _quiet_stderr():
        eager = [_user_frames_of(_decode_in_a_step, data) for _ in range(3)]
        compiled = [_user_frames_of(compiled_step, data) for _ in range(3)]
        with ndd_trace.enabled():
            transparent = [_user_frames_of(_decode_in_a_step, data) for _ in range(3)]
    assert eager == [eager[0]] * 3, eager
    assert compiled == eager and transparent == eager, (eager, compiled, transparent)


class _Probe:
    """Hung on a caught exception: alive as long as the exception is."""


def test_a_caught_compiled_run_error_is_freed_when_dropped_as_eagerly(jpeg_bytes):
    """Found by the session's differential sweep: a failed compiled run's replay held the run
    (which holds its error, and the data it was fed), and DALI's text for a deferred error
    was read once from an error whose raising frame held it: cycles, freed only at a garbage
    collection."""
    import weakref
    corrupt = ndd.as_batch([np.frombuffer(jpeg_bytes[0], dtype=np.uint8),
                            np.arange(100, dtype=np.uint8)])

    def decode(jpegs):
        return ndd.flip(ndd.decoders.image(jpegs), horizontal=1)

    alive = []
    gc.disable()
    try:
        with _quiet_stderr():
            for call in (decode, ndd_trace.compile(decode)):
                held = []
                try:
                    call(corrupt).evaluate()
                except RuntimeError as error:
                    error.probe = _Probe()  # (an exception cannot be weakly referred to)
                    held.append(weakref.ref(error.probe))
                alive.append(held[0]() is not None)
    finally:
        gc.enable()
    assert alive == [False, False]


def test_a_caught_feeding_error_is_freed_when_dropped(monkeypatch):
    """A pipeline that refuses a call's data raises from a local of the frame that fed it,
    which its traceback holds: a cycle (with the call's data) until a garbage collection."""
    import weakref
    from ndd_trace.execution.feed import Feed
    data = ndd.as_batch([np.zeros((4, 4, 3), np.uint8)] * 2, layout="HWC")
    step = ndd_trace.compile(lambda x: ndd.flip(x, horizontal=1))
    step(data).evaluate()  # (built: the next call feeds it)

    def refusing(self, pipeline, items):
        raise RuntimeError("refused")

    monkeypatch.setattr(Feed, "into", refusing)
    held = []
    gc.disable()
    try:
        try:
            step(data)
        except RuntimeError as error:
            error.probe = _Probe()
            held.append(weakref.ref(error.probe))
        alive = held[0]() is not None
    finally:
        gc.enable()
    assert not alive


def _out_of_bounds(images):
    images = ndd.resize(images, size=[16, 16])
    return ndd.slice(images, rel_start=[0.1, 0.1], rel_shape=[0.95, 0.95], axes=[0, 1],
                     out_of_bounds_policy="error")


def _metadata_seen(step, images):
    seen = []
    out = step(images)
    for name in ("dtype", "layout", "ndim", "batch_size", "shape"):
        try:
            seen.append(str(getattr(out, name)))
        except Exception as error:  # noqa: BLE001 (compared with eager's)
            seen.append(f"raised {type(error).__name__}")
    return seen


def test_a_failing_compiled_result_tells_its_dtype_as_eagerly():
    """Found by the session's differential sweep: a compiled call's results read their type,
    layout and ndim from the run, which raised; eager answers them from the op's schema (the
    trace's inference), and raises only at the data."""
    images = ndd.as_batch([np.zeros((16, 16, 3), np.uint8)] * 2, layout="HWC")
    eager = _metadata_seen(_out_of_bounds, images)
    assert "raised" not in " ".join(eager[:4]) and eager[4] == "raised RuntimeError", eager
    assert _metadata_seen(ndd_trace.compile(_out_of_bounds), images) == eager


# -- the nineteenth session's sweep (/work/sweep19, written as a new user): kept until fixed ---

def _out_of_bounds_crop(images, start=0.7):
    return ndd.slice(images, rel_start=[start, start], rel_shape=[0.5, 0.5], axes=[0, 1],
                     out_of_bounds_policy="error")


def _stacked_failing(images):
    crop = _out_of_bounds_crop(images)
    return ndd.stack(crop, crop, axis=0)


def _mean_of_failing(images):
    return ndd.reductions.mean(_out_of_bounds_crop(images), axes=[0, 1])


def _attributes_seen(step, names):
    seen = []
    source = ndd.as_batch([np.zeros((20, 20, 3), np.uint8), np.ones((16, 12, 3), np.uint8)],
                          layout="HWC")
    for _ in range(2):
        out = step(ndd.resize(source, size=[20, 20]))
        for name in names:
            try:
                value = np.asarray(out.select(0)) if name == "sample" else getattr(out, name)
                seen.append((name, str(value)[:40]))
            except Exception as error:  # noqa: BLE001 (compared with eager's)
                seen.append((name, f"raised {type(error).__name__}: {str(error).splitlines()[0]}"))
    return seen


def test_the_layout_of_a_stack_of_a_failing_result_raises_as_eagerly():
    """Issue 35: DALI infers a stack's ndim but not its layout, so eager runs the op to answer
    `.layout` (and raises the failure); the trace answered None from its metadata."""
    eager = _attributes_seen(_stacked_failing, ("dtype", "ndim", "layout"))
    with _quiet_stderr():
        compiled = _attributes_seen(ndd_trace.compile(_stacked_failing), ("dtype", "ndim", "layout"))
        with ndd_trace.enabled():
            transparent = _attributes_seen(_stacked_failing, ("dtype", "ndim", "layout"))
    assert compiled == eager and transparent == eager, (eager, compiled, transparent)


def test_a_sample_of_a_reduction_of_a_failing_result_raises_eagers_text():
    """Found by the nineteenth session's sweep: transparent mode named the mode its region ran
    in (DALI reads a sample in EvalMode.deferred: "during deferred evaluation") where eager
    names the mode of the calls ("during asynchronous execution")."""
    eager = _attributes_seen(_mean_of_failing, ("sample",))
    with _quiet_stderr(), ndd_trace.enabled():
        transparent = _attributes_seen(_mean_of_failing, ("sample",))
    assert transparent == eager, (eager, transparent)


def _user_lines_of_a_deferred_failure(step):
    source = ndd.as_batch([np.zeros((20, 20, 3), np.uint8)] * 2, layout="HWC")
    step(ndd.resize(source, size=[20, 20]), 0.1).shape
    out = step(ndd.resize(source, size=[20, 20]), 0.7)  # the failing call
    try:
        out.shape
    except RuntimeError:
        printed = traceback.format_exc()
    return [line.split(", ", 1)[1] for line in printed.splitlines()
            if line.startswith("  File ") and __file__ in line]


def test_a_deferred_failures_traceback_shows_the_steps_call_as_eagerly():
    """Found by the nineteenth session's sweep: an error that surfaces at a result's first use
    showed the op's line but not the user's frames it was called from (the call of the
    compiled step), which eager's traceback shows (the op call's whole stack)."""
    with _quiet_stderr():
        assert_matches_eager(_user_lines_of_a_deferred_failure, Step(_out_of_bounds_crop),
                             modes=("step", "transparent"), warn="ignore")


def _crop_in_a_helper(images, side):
    return ndd.crop(images, crop=[side, side], out_of_bounds_policy="error")


def _step_calling_a_helper(images, side):
    return _crop_in_a_helper(images, side)  # (this line is in eager's traceback)


def _consumed_failure(images, side):
    crop = ndd.crop(images, crop=[side, side], out_of_bounds_policy="error")
    flipped = ndd.flip(crop, horizontal=1)
    as_float = ndd.cast(flipped, dtype=ndd.float32)
    return ndd.cat(as_float, ndd.cast(images, dtype=ndd.float32), axis=0)


def _chain_of_a_deferred_failure(step):
    """Each exception of a failure's `__cause__` chain, as (type, first line, this file's
    lines in its traceback), from the result's first use back to the op's own error."""
    source = ndd.as_batch([np.zeros((20, 20, 3), np.uint8)] * 2, layout="HWC")
    out = step(ndd.resize(source, size=[20, 20]), 30)
    try:
        out.shape
    except RuntimeError as error:
        chain, link = [], error
        while link is not None:
            lines = [frame.lineno for frame in traceback.extract_tb(link.__traceback__)
                     if frame.filename == __file__]
            chain.append((type(link).__name__, str(link).splitlines()[0], lines))
            link = link.__cause__
        return chain
    return None


def _deferred_inside(images, side):
    with ndd.EvalMode.deferred:  # (the function's own mode: its errors name it)
        crop = ndd.crop(images + 1, crop=[side, side], out_of_bounds_policy="error")
        return crop * 2


@pytest.mark.parametrize("body", [_step_calling_a_helper, _consumed_failure, _deferred_inside],
                         ids=["helper-frames", "each-consuming-op-a-link",
                              "the-functions-own-eval-mode"])
def test_a_deferred_failures_chain_is_eagers(body):
    """Found by this session's probe: a compiled function's deferred failure left out the
    frames of a helper between the function and the op; and eager re-raises a failure in each
    op that evaluates the failed result ("An error happened during asynchronous execution" at
    that op's line, caused by the one before), where ndd_trace's chain had the op's error only."""
    ways = (("eager", body), ("compiled", ndd_trace.compile(body)), ("transparent", body))
    chains = []
    for mode, step in ways:
        with _quiet_stderr(), ndd_trace.enabled() if mode == "transparent" else contextlib.nullcontext():
            chains.append(_chain_of_a_deferred_failure(step))
    eager, compiled, transparent = chains
    assert eager is not None and compiled == eager and transparent == eager, chains


def _lines_of_a_failure_at_the_call(step):
    """This file's lines in the traceback of a call that fails at the call (user data)."""
    images = ndd.as_batch([np.zeros((20, 20, 3), np.uint8)] * 2, layout="HWC")
    try:
        step(images, 30)
    except RuntimeError as error:
        return [(frame.lineno, frame.name) for frame in traceback.extract_tb(error.__traceback__)
                if frame.filename == __file__]
    return None


def test_a_failure_at_the_call_in_a_helper_shows_the_functions_frame_as_eagerly():
    """Found by this session's sweep: the first compiled call's error (raised at the call, the
    op given user data) went from the caller's line straight to the helper's, leaving out the
    compiled function's line that called the helper."""
    ways = (("eager", _step_calling_a_helper),
            ("compiled", ndd_trace.compile(_step_calling_a_helper)),
            ("transparent", _step_calling_a_helper))
    for _ in range(3):
        seen = []
        for mode, step in ways:
            with _quiet_stderr(), ndd_trace.enabled() if mode == "transparent" else contextlib.nullcontext():
                seen.append(_lines_of_a_failure_at_the_call(step))
        assert seen[0] is not None and seen[1] == seen[0] and seen[2] == seen[0], seen


def test_a_deferred_failures_traceback_stays_eagers_after_the_pipeline_failed_before():
    """Found by this session's run of the suite in a new order: once a region's pipeline had
    failed twice its calls ran eagerly (interpreted), and their failure lost the user's frames
    the call was made from (the recorded call's stack was not on the interpreted copy)."""
    def lines_in(mode, step):
        with _quiet_stderr(), ndd_trace.enabled() if mode == "transparent" else contextlib.nullcontext():
            return _user_lines_of_a_deferred_failure(step)

    ways = (("eager", _out_of_bounds_crop), ("compiled", ndd_trace.compile(_out_of_bounds_crop)),
            ("transparent", _out_of_bounds_crop))
    for _ in range(4):  # (the pipeline fails each time: later calls run eagerly)
        eager, compiled, transparent = [lines_in(mode, step) for mode, step in ways]
        assert compiled == eager and transparent == eager, (eager, compiled, transparent)


def _rotated_after_a_failing_op(images, fill):
    return ndd.rotate(_out_of_bounds_crop(images), angle=10.0, fill_value=fill)


def _bad_argument_error():
    source = ndd.as_batch([np.full((10, 10, 3), 7, np.uint8)] * 2, layout="HWC")
    try:
        _rotated_after_a_failing_op(ndd.resize(source, size=[9, 9]), "x").evaluate()
    except Exception as error:  # noqa: BLE001 (compared with eager's)
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return "no error"


def test_a_bad_argument_after_a_failing_op_raises_as_eagerly():
    """Found by the nineteenth session's sweep: transparent mode ran the failing input of a call
    it runs eagerly (a bad argument) before the call, which raised that input's error where
    eager checks the argument first (ValueError)."""
    eager = _bad_argument_error()
    with _quiet_stderr(), ndd_trace.enabled():
        transparent = _bad_argument_error()
    assert transparent == eager, (eager, transparent)


def _blurred_flat_samples(images):
    """A separable blur of 1-D samples whose layout is empty (`reshape` to one dimension)."""
    flat = ndd.reshape(images, shape=[90])
    return ndd.gaussian_blur(flat, sigma=0.5, window_size=3)


def test_a_blur_of_samples_without_layout_raises_as_eagerly():
    """Eager raises ValueError 'Unexpected layout of output 0. Got "", expected "*"' at the
    result's use (GaussianBlur and Laplacian check their output's layout when run eagerly, on
    1-D samples without a layout); a pipeline ran them and gave values (found by the
    twenty-sixth session's sweep of transparent mode's replayed tensor arguments, p01115).
    Such a call now runs eagerly (a graph break)."""
    rng = np.random.default_rng(5)
    images = ndd.as_batch([rng.integers(0, 256, (6, 5, 3), dtype=np.uint8) for _ in range(4)],
                          layout="HWC")
    assert_matches_eager(_blurred_flat_samples, images, raises=True, warn="ignore")


def _transpose_rejected_after_flip(images):
    """A call DALI rejects when it builds the operator, given another op's result."""
    return ndd.transpose(ndd.flip(images, horizontal=1), perm=[0, 0, 1])


@pytest.mark.parametrize("keep_errors", [False, True], ids=["dropped", "kept"])
@pytest.mark.parametrize("order", [("owned",) * 3, ("owned", "user", "user"),
                                   ("user", "owned", "owned"), ("user", "user", "owned")],
                         ids="-".join)
@pytest.mark.parametrize("op", [_transpose_rejected, _transpose_rejected_after_flip],
                         ids=["alone", "after_flip"])
def test_rejected_calls_in_every_order_as_eagerly(op, order, keep_errors):
    """DALI's operator cache decides a rejected call's text ('num_threads' where it reuses the
    failed instance): each order of failures at the call and at a use, errors kept or
    dropped, gives eager's texts (the twenty-sixth session's probe of the orders)."""
    assert_matches_eager(_texts_of_rejected_calls_in_order, Step(op), order, keep_errors,
                         modes=("step", "transparent"), warn="ignore")


def _flip_and_noise(x):
    return ndd.flip(x, horizontal=1), ndd.random.uniform(batch_size=x.batch_size, range=[0, 1])


def _step_given_a_failed_result(step):
    """A step given a result whose own run fails (a crop larger than its DALI-owned image):
    the call goes through, the result that does not read it is computed, the one that does
    fails at its use."""
    image = ndd.copy(ndd.as_batch([np.zeros((12, 16, 3), np.uint8)], layout="HWC")).evaluate()
    step(ndd.crop(image, crop=[4, 4]))[1].evaluate()  # (traced and built on a good one)
    flipped, noise = step(ndd.crop(image, crop=[40, 40]))
    seen = [np.asarray(noise.select(0)).tolist()]
    try:
        flipped.evaluate()
    except RuntimeError as error:
        seen.append(str(error.__cause__).splitlines()[0])
    return seen


def test_a_failed_result_given_to_a_compiled_call_fails_only_where_read():
    """Eager defers the failure of a result given to a function to the results that read it,
    at their use; a compiled call raised it at the call, losing the others (found by the
    twenty-sixth session's error-path sweep, p18). The call now runs eagerly, and says so."""
    assert_matches_eager(_step_given_a_failed_result, Step(_flip_and_noise),
                         modes=("step", "transparent"), warn="ignore")


def test_a_failed_result_given_to_a_compiled_call_after_reader_steps(jpeg_dir):
    """The same once compiled calls were fed a reader's batches: a call then goes through the
    run-ahead path, which checked no argument (found by the suite's order: it failed only
    after a test with a reader loop)."""
    decode = ndd_trace.compile(lambda jpegs: ndd.resize(ndd.decoders.image(jpegs), size=[8, 8]))
    for jpegs, _ in ndd.readers.File(file_root=str(jpeg_dir)).next_epoch(batch_size=2):
        decode(jpegs).evaluate()
    assert_matches_eager(_step_given_a_failed_result, Step(_flip_and_noise),
                         modes=("step", "transparent"), warn="ignore")


def _flip_and_two_crops(a, b):
    return ndd.flip(a, horizontal=1), ndd.crop(a, crop=[40, 40]), ndd.crop(b, crop=[50, 50])


def _results_of_two_failing_ops(step):
    """A step whose two crops fail on their own (each larger than its DALI-owned image), and
    whose flip does not: each result read, its value or its error's cause."""
    def owned(height):
        return ndd.copy(ndd.as_batch([np.zeros((height, 16, 3), np.uint8)],
                                     layout="HWC")).evaluate()

    step(owned(60), owned(60))[0].evaluate()  # (traced and built on good data)
    seen = []
    for result in step(owned(12), owned(10)):
        try:
            seen.append(np.asarray(result.select(0)).shape)
        except RuntimeError as error:
            seen.append(str(error.__cause__).splitlines()[0])
    return seen


def test_two_failing_ops_of_one_call_each_fail_their_own_results_as_eagerly():
    """Eager computes the flip and fails each crop's result with that crop's own error; a
    compiled call's run failed every result with the first crop's (found by the twenty-sixth
    session's error-path sweep, p32/p36): its other results are now interpreted past every op
    that fails on its own."""
    assert_matches_eager(_results_of_two_failing_ops, Step(_flip_and_two_crops),
                         modes=("step", "transparent"), warn="ignore")


def _rotated_by(images, angle):
    return ndd.rotate(images, angle=angle, fill_value=0)


def _rotate_by_none(step):
    images = ndd.as_batch([np.zeros((6, 6, 3), np.uint8)] * 2, layout="HWC")
    return step(images, None)


def test_a_required_argument_given_none_raises_eagers_error_in_every_mode():
    """Found by the twenty-seventh session's sweep: `angle=None` (a required argument) is
    recorded as not given, and transparent mode's eager replay then left it out, raising
    Python's TypeError ("missing 1 required keyword-only argument") where eager raises DALI's
    ValueError ("doesn't have a default value")."""
    assert_matches_eager(_rotate_by_none, Step(_rotated_by), modes=("step", "transparent"),
                         warn="ignore")


def _rotate_by(x, angle):
    return ndd.rotate(x, angle=angle)


def test_a_pipeline_that_cannot_be_built_warns_at_the_users_call():
    """Found by the twenty-eighth session's sweep: `angle=None` for a required argument makes a
    pipeline DALI cannot build; the call runs eagerly (eager's error), and the warning that
    says so names the user's line, not ndd_trace's."""
    x = ndd.as_batch([np.zeros((4, 4, 3), np.uint8)], layout="HWC")
    assert_matches_eager(_rotate_by, x, None, modes=("compiled",), warn="ignore", raises=True)
    compiled = ndd_trace.compile(_rotate_by)
    with pytest.warns(ndd_trace.NddTraceWarning, match="could not be built") as seen:
        with pytest.raises(ValueError):
            compiled(x, None)
    assert [warning.filename for warning in seen] == [__file__]


def _slice_left_unused(x):
    unused = ndd.slice(x, [0], [100], axes=[0], out_of_bounds_policy="error")  # noqa: F841
    return x * 2


def test_an_unused_op_on_user_data_raises_at_the_call_as_eagerly():
    """Found by the twenty-eighth session's sweep: an op given user data runs at the call in
    eager ndd, so its error raises there even if its result is never used; a pipeline drops
    dead code, so the compiled call returned. Such a call keeps the function from being
    compiled whole (transparent mode runs it at the call)."""
    x = ndd.as_batch([np.arange(5, dtype=np.float32)])
    assert_matches_eager(_slice_left_unused, x, modes=("compiled", "transparent"),
                         warn="ignore", raises=True)
    with pytest.warns(ndd_trace.NddTraceWarning, match="does not use its result"):
        with pytest.raises(RuntimeError):
            ndd_trace.compile(_slice_left_unused)(x)
