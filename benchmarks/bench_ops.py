"""Benchmark DALI dynamic mode (eager), DALI capture mode, ndd_trace and a hand-written pipeline.

Each workload runs in every mode, each in a fresh subprocess (this script re-invoked with
``--worker MODE WORKLOAD``):

- ``eager``: plain dynamic mode (``import nvidia.dali.experimental.dynamic as ndd``), one call of
  the workload function per batch.
- ``capture``: DALI 2.4's capture mode, the same loop driven by
  ``ndd.ExternalSource(...).captured(batch_size=N)`` or
  ``ndd.readers.File(...).next_epoch(batch_size=N, capture=True)``.
- ``ndd_trace``: the workload function decorated with ``ndd.compile`` (after ``import ndd_trace``),
  called once per batch with the same inputs as ``eager``.
- ``ndd_trace_fed``: the ``ndd_trace`` function fed ready-made batches (made once, on the
  device, before timing) instead of calling the ExternalSource per step: the compiled function's
  own cost, fed as ``pipeline_percall`` is (``small_ops`` and ``tiny``).
- ``ndd_trace_loop``: a compiled generator over the reader (``decode_rrc_cmn``) or over the
  ExternalSource (``tiny``: a ``for`` over ``range`` calling ``source()``, which ndd_trace runs
  as a checked loop, not as one pipeline; the row's notes say how it ran).
- ``ndd_trace_optimize``: the same compiled generator with ``optimize=True`` (the decoder and
  ``random_resized_crop`` fused into ``decoders.image_random_crop`` + ``resize``; on the GPU the
  decoder's ``hw_decoder_load`` set to ``--hw-decoder-load``), ``decode_rrc_cmn`` only.
- ``ndd_trace_checked``: the same compiled generator with per-step Python in its loop body (an
  ``enumerate`` step counter and a side effect), which ndd_trace cannot prove step-invariant, so
  it runs in checked mode (each step's Python as written, its ndd calls run ahead and checked).
- ``transparent``: the ``eager`` code unmodified, under ``ndd_trace.enable()`` (what
  ``python -m ndd_trace`` does to a script): the reader reads ahead, regions run ahead.
- ``dataloader``: a torchvision ``DataLoader`` doing the same work (``decode_rrc_cmn``).
- ``pipeline``: a hand-written ``@pipeline_def`` with the same operators, fed the same data
  (``fn.external_source`` over the same in-memory batches, or ``fn.readers.file``).
- ``pipeline_fused``: the hand-written pipeline as a DALI expert writes it
  (``fn.decoders.image_random_crop`` + ``fn.resize`` instead of decode + ``random_resized_crop``,
  ``hw_decoder_load=--hw-decoder-load`` on the GPU), ``decode_rrc_cmn`` only.
- ``decode_only``: the reader and the decoder alone (``fn.decoders.image``, the same
  ``hw_decoder_load``): the ceiling of the machine for this data, every mode is also reported as
  a fraction of it (``decode_rrc_cmn`` only; ROI decoding decodes less, so a fused mode can pass
  it).
- ``fused_decode_only``: the reader and the ROI decoder alone (``fn.decoders.image_random_crop``,
  the same ``hw_decoder_load``): the ceiling of every rewrite that keeps eager's crop windows'
  distribution (what ``optimize`` and ``pipeline_fused`` decode, with nothing after it).
- ``pipeline_split``: the hand-written pipeline cut where ndd_trace cuts it: the reader in a
  pipeline of its own (read ahead), its batches handed to a second pipeline (decode onward)
  through an ``fn.external_source`` callback, both prefetching: the ceiling of a compiled step
  or generator fed by a reader stream, so ``pipeline`` / ``pipeline_split`` is what the cut
  costs (``decode_rrc_cmn`` only).
- ``pipeline_percall``: the same hand-written pipeline, built by hand with a named
  ``fn.external_source`` and driven one step at a time from Python (``feed_input`` + ``run``, no
  prefetching): the floor of a per-call function (``small_ops`` and ``tiny``).

On ``decode_rrc_cmn``, ``ndd_trace`` is the README's pattern: a compiled step called from the
user's eager reader loop (``for jpegs, _ in reader.next_epoch(...): step(jpegs)``).

Workloads:

- ``small_ops``: 13 cheap operator calls (geometry, color, cast, arithmetic, normalize, transpose,
  ``.slice``) on batches of 64x64x3 uint8 images cut from real photos (default batch size 8).
- ``tiny``: issue 34's per-step-cost workload: 13 cheap operator calls (flip, crop, resize,
  transpose, color, pad, cast, ``crop_mirror_normalize`` with a random mirror), which DALI's
  capture mode takes whole, on 200 batches of 32x32x3 uint8 images from an ExternalSource
  (default batch size 8).
- ``decode_rrc_cmn``: ``decoders.image`` + ``random_resized_crop`` + ``crop_mirror_normalize`` on
  real JPEGs read with the File reader (default batch size 16).

Every mode reports its time to first batch (process-local: from the start of the mode's setup, i.e.
reader, pipeline or decorator creation, to the first consumed result), then runs ``--warmup`` more
steps that are not timed, then ``--steps`` timed steps. The parent prints a table with ratios
against ``eager``, ``pipeline`` and ``pipeline_percall``, and where a step's time went (ms per
timed step): ``source`` (the ExternalSource call or the reader / capture-mode iterator step),
``call`` (the workload function) and ``consume`` (evaluate, and synchronize on the GPU) for the
dynamic modes; ``feed`` and ``run`` for ``pipeline_percall``; transparent mode's own stages
(``ndd_trace.modes.lazy.step_breakdown()``) after them. ``call`` + ``consume`` of ``ndd_trace`` is
what the compiled function costs, to set beside the ``step`` of ``pipeline_percall`` (which is
fed ready-made TensorLists, with no source call).

In DALI 2.4 the first dynamic-mode operator call from a module parses that module with libcst (to
find constant arguments, in eager mode too), so the first batch of ``eager`` and ``capture``
includes parsing this file; a hand-written pipeline does no such thing.

Example::

    .venv/bin/python benchmarks/bench_ops.py --steps 200 --warmup 20
    .venv/bin/python benchmarks/bench_ops.py --workloads decode_rrc_cmn --modes eager,pipeline
    .venv/bin/python benchmarks/bench_ops.py --device gpu --batch-size 64 --json /tmp/bench.json
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import json
import logging
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
from nvidia.dali import fn, pipeline_def, types

BENCHMARK_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARK_DIR.parent
if str(BENCHMARK_DIR) not in sys.path:
    sys.path.insert(0, str(BENCHMARK_DIR))

from _data import jpeg_paths, make_jpeg_dir  # noqa: E402

MODES = ("eager", "capture", "ndd_trace", "ndd_trace_fed", "ndd_trace_loop", "ndd_trace_checked",
         "ndd_trace_optimize", "transparent", "pipeline_percall", "pipeline", "pipeline_fused",
         "decode_only", "fused_decode_only", "pipeline_split", "dataloader")
DECODE_ONLY_MODES = ("ndd_trace_optimize", "pipeline_fused", "decode_only", "fused_decode_only",
                     "pipeline_split")
PIPELINE_MODES = ("pipeline", "pipeline_fused", "decode_only", "fused_decode_only",
                  "pipeline_split")
WORKLOADS = ("small_ops", "tiny", "decode_rrc_cmn")
DEFAULT_BATCH_SIZES = {"small_ops": 8, "tiny": 8, "decode_rrc_cmn": 16}
# the workloads fed in-memory image batches by an ExternalSource: their images' side
IMAGE_SIDES = {"small_ops": 64, "tiny": 32}
# the ExternalSource's batch count where the workload fixes it: issue 34's 200 for tiny, the photos
# cycled to fill them exactly (the default 256 photos make 32 distinct batches of 8)
SOURCE_BATCHES = {"tiny": 200}
RESULT_PREFIX = "BENCH_RESULT "
# pipeline_fused's and decode_only's hw_decoder_load, tuned by hand: the fastest share ndd_trace's
# tuner measured on the H200 for the train workload (0.9, the value used before, ran 0.80-0.92x it)
FUSED_HW_DECODER_LOAD = 0.65


@dataclass
class Result:
    """One (workload, mode) measurement, as sent from a worker to the parent."""

    workload: str
    mode: str
    status: str  # "ok", "unavailable" or "failed"
    batch_size: int
    device: str
    steps: int = 0
    warmup: int = 0
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    first_batch_s: float | None = None
    warmup_s: float | None = None
    notes: str = ""
    error: str = ""
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Workload functions (dynamic mode). Arguments are literals on purpose: DALI capture mode only
# captures calls whose arguments it can prove constant from the source code, and module-level
# constants are never captured.
# --------------------------------------------------------------------------------------------


def small_ops(images):
    """Run 13 cheap operator calls on a batch of HWC uint8 images."""
    angle = ndd.random.uniform(range=[-15.0, 15.0], batch_size=images.batch_size)
    images = ndd.flip(images, horizontal=1)
    images = ndd.crop(images, crop=[56, 56])
    images = ndd.resize(images, size=[48, 48])
    images = ndd.rotate(images, angle=angle, keep_size=True, fill_value=0)
    images = ndd.hsv(images, hue=10.0, saturation=1.2)
    images = ndd.brightness_contrast(images, brightness=1.1, contrast=0.9)
    images = ndd.cast(images, dtype=ndd.float32)
    images = images * (1 / 255)
    images = images - 0.5
    images = ndd.normalize(images, mean=0.0, stddev=0.25)
    images = ndd.transpose(images, perm=[2, 0, 1])
    return images.slice[:, 4:44, 4:44]


def tiny_step(x, bs):
    """Issue 34's tiny workload, as the issue writes it: 13 cheap calls capture mode takes whole."""
    x = ndd.flip(x, horizontal=1); x = ndd.crop(x, crop=[28, 28]); x = ndd.resize(x, size=[32, 32])
    x = ndd.transpose(x, perm=[2, 0, 1]); x = ndd.transpose(x, perm=[1, 2, 0])
    x = ndd.brightness_contrast(x, brightness=1.1, contrast=0.9); x = ndd.hsv(x, hue=10.0, saturation=1.1)
    x = ndd.pad(x, axis_names="HW", shape=[36, 36]); x = ndd.crop(x, crop=[32, 32])
    x = ndd.cast(x, dtype=ndd.float32); x = ndd.flip(x, vertical=1)
    mirror = ndd.random.coin_flip(batch_size=bs)
    return ndd.crop_mirror_normalize(x, mirror=mirror, dtype=ndd.float32, output_layout="CHW",
                                     mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])


def tiny_loop(source, steps):
    """`steps` steps of tiny over the ExternalSource as a generator. ndd_trace cannot compile it
    as one pipeline (only a loop over reader.next_epoch(...) or source.captured(...) is): it runs
    as a checked loop, each step's Python as written, its ndd calls run ahead and checked."""
    for _ in range(steps):
        x = source()
        yield tiny_step(x, x.batch_size)


def _random_resized_crop_mirror_normalize(images):
    """Random-resized-crop, randomly mirror and normalize a batch of decoded images."""
    images = ndd.random_resized_crop(images, size=[224, 224])
    mirror = ndd.random.coin_flip(probability=0.5, batch_size=images.batch_size)
    return ndd.crop_mirror_normalize(
        images,
        mirror=mirror,
        dtype=ndd.float32,
        output_layout="CHW",
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
    )


def decode_rrc_cmn_cpu(jpegs):
    """Decode JPEGs on the CPU, then random-resized-crop, mirror and normalize them."""
    images = ndd.decoders.image(jpegs, device="cpu")
    return _random_resized_crop_mirror_normalize(images)


def decode_rrc_cmn_gpu(jpegs):
    """Decode JPEGs on the GPU, then random-resized-crop, mirror and normalize them."""
    images = ndd.decoders.image(jpegs, device="gpu")
    return _random_resized_crop_mirror_normalize(images)


def decode_rrc_cmn_loop(reader, batch_size, device):
    """One epoch of the decode workload as a generator: compiled, its pipeline owns the reader."""
    for jpegs, _labels in reader.next_epoch(batch_size=batch_size):
        images = ndd.decoders.image(jpegs, device=device)
        yield _random_resized_crop_mirror_normalize(images)


def decode_rrc_cmn_loop_counted(reader, batch_size, device, seen):
    """The same epoch with per-step Python (a step counter kept in `seen`): checked mode."""
    for step, (jpegs, _labels) in enumerate(reader.next_epoch(batch_size=batch_size)):
        images = ndd.decoders.image(jpegs, device=device)
        seen["steps"] = step + 1
        yield _random_resized_crop_mirror_normalize(images)


def workload_function(workload: str, device: str) -> Callable:
    """Return the dynamic-mode function that processes one batch of `workload`."""
    if workload == "small_ops":
        return small_ops
    if workload == "tiny":
        return tiny_step
    return decode_rrc_cmn_gpu if device == "gpu" else decode_rrc_cmn_cpu


# --------------------------------------------------------------------------------------------
# Hand-written pipelines doing the same work.
# --------------------------------------------------------------------------------------------


def build_pipeline(workload: str, options: argparse.Namespace, inputs, percall: bool = False,
                   variant: str = "pipeline"):
    """Build the hand-written pipeline of `workload` (`inputs`: batches or a JPEG directory);
    `percall`: an ExternalSource workload's (small_ops, tiny) with a named external source fed
    by `feed_input`, no prefetching;
    `variant`: "pipeline_fused", "decode_only" or "fused_decode_only" for decode_rrc_cmn's
    expert-written ones."""

    @pipeline_def
    def external_source_pipeline():
        images = fn.external_source(
            source=inputs, cycle="quiet", batch=True, layout="HWC", device=options.device
        )
        return pipeline_body(images)

    decoder_device = "mixed" if options.device == "gpu" else "cpu"
    # the GPU decoder's share for the hardware JPEG decoder (a mixed-backend argument only)
    load = FUSED_HW_DECODER_LOAD if options.hw_decoder_load is None else options.hw_decoder_load
    tuning = {"hw_decoder_load": load} if options.device == "gpu" else {}

    def jpegs_of_reader():  # the same reader (and order of samples) in each variant
        jpegs, _labels = fn.readers.file(
            file_root=str(inputs),
            random_shuffle=True,
            seed=options.seed,
            pad_last_batch=True,
            name="Reader",
        )
        return jpegs

    def mirror_normalize(images):  # the same last step in each variant
        return fn.crop_mirror_normalize(
            images,
            mirror=fn.random.coin_flip(probability=0.5),
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[123.675, 116.28, 103.53],
            std=[58.395, 57.12, 57.375],
        )

    @pipeline_def
    def decode_rrc_cmn_pipeline():  # the eager code's ops, written the obvious way
        images = fn.decoders.image(jpegs_of_reader(), device=decoder_device)
        images = fn.random_resized_crop(images, size=[224, 224])
        return mirror_normalize(images)

    @pipeline_def
    def decode_rrc_cmn_fused_pipeline():
        images = fn.decoders.image_random_crop(jpegs_of_reader(), device=decoder_device, **tuning)
        images = fn.resize(images, size=[224, 224])
        return mirror_normalize(images)

    @pipeline_def
    def decode_only_pipeline():
        return fn.decoders.image(jpegs_of_reader(), device=decoder_device, **tuning)

    @pipeline_def
    def fused_decode_only_pipeline():
        return fn.decoders.image_random_crop(jpegs_of_reader(), device=decoder_device, **tuning)

    @pipeline_def
    def reader_only_pipeline():
        return jpegs_of_reader()

    @pipeline_def
    def split_body_pipeline(source):  # decode onward, fed the reader pipeline's batches
        jpegs = fn.external_source(source=source, batch=True)
        images = fn.decoders.image(jpegs, device=decoder_device)
        images = fn.random_resized_crop(images, size=[224, 224])
        return mirror_normalize(images)

    @pipeline_def
    def percall_pipeline():
        images = fn.external_source(name="images", layout="HWC", device=options.device)
        return pipeline_body(images)

    def small_ops_pipeline_body(images):
        angle = fn.random.uniform(range=[-15.0, 15.0])
        images = fn.flip(images, horizontal=1)
        images = fn.crop(images, crop=[56, 56])
        images = fn.resize(images, size=[48, 48])
        images = fn.rotate(images, angle=angle, keep_size=True, fill_value=0)
        images = fn.hsv(images, hue=10.0, saturation=1.2)
        images = fn.brightness_contrast(images, brightness=1.1, contrast=0.9)
        images = fn.cast(images, dtype=types.FLOAT)
        images = images * (1 / 255)
        images = images - 0.5
        images = fn.normalize(images, mean=0.0, stddev=0.25)
        images = fn.transpose(images, perm=[2, 0, 1])
        return images[:, 4:44, 4:44]

    def tiny_pipeline_body(images):
        images = fn.flip(images, horizontal=1)
        images = fn.crop(images, crop=[28, 28])
        images = fn.resize(images, size=[32, 32])
        images = fn.transpose(images, perm=[2, 0, 1])
        images = fn.transpose(images, perm=[1, 2, 0])
        images = fn.brightness_contrast(images, brightness=1.1, contrast=0.9)
        images = fn.hsv(images, hue=10.0, saturation=1.1)
        images = fn.pad(images, axis_names="HW", shape=[36, 36])
        images = fn.crop(images, crop=[32, 32])
        images = fn.cast(images, dtype=types.FLOAT)
        images = fn.flip(images, vertical=1)
        return mirror_normalize(images)  # the coin flip's default probability is 0.5, as eager's

    pipeline_body = tiny_pipeline_body if workload == "tiny" else small_ops_pipeline_body
    if percall:
        pipe = percall_pipeline(
            batch_size=options.batch_size, num_threads=options.threads,
            device_id=0 if options.device == "gpu" else None, seed=options.seed,
            prefetch_queue_depth=1)
        pipe.build()
        return pipe
    definition = (external_source_pipeline if workload in IMAGE_SIDES
                  else decode_rrc_cmn_pipeline)
    if variant == "pipeline_fused":
        definition = decode_rrc_cmn_fused_pipeline
    elif variant == "decode_only":
        definition = decode_only_pipeline
    elif variant == "fused_decode_only":
        definition = fused_decode_only_pipeline
    elif variant == "pipeline_split":
        reader = reader_only_pipeline(
            batch_size=options.batch_size, num_threads=options.threads,
            device_id=0 if options.device == "gpu" else None, seed=options.seed,
            prefetch_queue_depth=2)
        reader.build()
        definition = functools.partial(split_body_pipeline, lambda: reader.run()[0])
    pipe = definition(
        batch_size=options.batch_size,
        num_threads=options.threads,
        device_id=0 if options.device == "gpu" else None,
        seed=options.seed,
        prefetch_queue_depth=2,
    )
    pipe.build()
    return pipe


# --------------------------------------------------------------------------------------------
# Input data.
# --------------------------------------------------------------------------------------------


def load_small_image_batches(root: Path, batch_size: int, side: int,
                             batch_count: int | None = None) -> list[list[np.ndarray]]:
    """Decode every JPEG once with Pillow, resize it to side x side x 3 and group the images in
    `batch_count` batches (default: as many whole batches as there are images, at least one),
    cycling over the images where they are fewer."""
    from PIL import Image

    images = []
    for path in jpeg_paths(root):
        with Image.open(path) as image:
            small = image.convert("RGB").resize((side, side))
            images.append(np.asarray(small, dtype=np.uint8))
    if batch_count is None:
        batch_count = max(1, len(images) // batch_size)
    images = list(itertools.islice(itertools.cycle(images), batch_count * batch_size))
    return [images[start : start + batch_size] for start in range(0, len(images), batch_size)]


def image_source(options: argparse.Namespace, data) -> ndd.ExternalSource:
    """Return the ExternalSource of an image workload's in-memory batches, cycling over them."""
    batches = [ndd.as_batch(batch, layout="HWC") for batch in data]
    return ndd.ExternalSource(batches, cycle="quiet", device=options.device)


def dynamic_inputs(workload: str, options: argparse.Namespace, capture: bool, data) -> tuple:
    """Return (an endless iterator of input batches, the ndd source object behind it)."""
    batch_size = options.batch_size
    if workload in IMAGE_SIDES:
        source = image_source(options, data)
        if capture:
            return source.captured(batch_size=batch_size), source
        return (source() for _ in itertools.count()), source

    reader = ndd.readers.File(
        file_root=str(data), random_shuffle=True, seed=options.seed, pad_last_batch=True
    )

    def jpeg_batches() -> Iterator:
        """Yield the encoded-JPEG batches of epoch after epoch."""
        while True:
            for jpegs, _labels in reader.next_epoch(batch_size=batch_size, capture=capture):
                yield jpegs

    return jpeg_batches(), reader


# --------------------------------------------------------------------------------------------
# Worker: one mode of one workload, in this process.
# --------------------------------------------------------------------------------------------


def cuda_device_count() -> int:
    """Return how many CUDA devices DALI can see (0 on a CPU-only machine)."""
    try:
        from nvidia.dali import backend

        return backend.GetCUDADeviceCount()
    except Exception:
        return 0


def require_gpu() -> None:
    """Exit with a clear message when `--device gpu` is asked for on a machine without a GPU."""
    if cuda_device_count() == 0:
        sys.exit(
            "bench_ops: --device gpu needs an NVIDIA GPU visible to DALI, but none was found "
            "(nvidia.dali.backend.GetCUDADeviceCount() == 0). Use --device cpu on this machine."
        )


def captured_operator_names(source) -> list[str] | None:
    """Return the operators DALI capture mode put in its pipeline (private API, best effort)."""
    try:
        return [node.op_class.__name__ for node in source._captured_iter._capture_ctx.nodes]
    except AttributeError:
        return None


def dynamic_mode_steps(workload, options, data, mode, notes: dict, times: dict) -> Iterator:
    """Yield once per consumed batch in the `eager`, `capture` or `ndd_trace` mode; add the
    seconds spent getting the input batch (`source`: the ExternalSource call or the reader /
    capture-mode iterator step), calling the workload function (`call`) and consuming its
    result (`consume`: evaluate, and synchronize on the GPU) to `times`."""
    function = workload_function(workload, options.device)
    if mode in ("ndd_trace", "ndd_trace_fed"):
        function = ndd.compile(function)
    if mode == "ndd_trace_fed":  # batches made once, on the device, as pipeline_percall's are
        batches = [ndd.as_batch(batch, layout="HWC", device=options.device).evaluate()
                   for batch in data]
        inputs, source = itertools.cycle(batches), None
    else:
        inputs, source = dynamic_inputs(workload, options, mode == "capture", data)
    synchronize = options.device == "gpu"
    clock = time.perf_counter
    try:
        step_index = 0
        while True:
            started = clock()
            try:
                batch = next(inputs)
            except StopIteration:
                return
            called = clock()
            # tiny_step takes the batch size as an argument, as issue 34 writes it
            outputs = function(batch, batch.batch_size) if workload == "tiny" else function(batch)
            consumed = clock()
            outputs.evaluate()
            if synchronize:
                ndd.get_current_stream().synchronize()
            done = clock()
            times["source"] += called - started
            times["call"] += consumed - called
            times["consume"] += done - consumed
            if mode == "capture" and step_index == 2:  # tracing done, pipeline built
                names = captured_operator_names(source)
                if names is not None:
                    notes["captured_ops"] = names
            step_index += 1
            yield
    finally:
        close = getattr(inputs, "close", None)
        if close is not None:
            close()


def compiled_loop_steps(workload, options, data, notes: dict, checked: bool = False,
                        optimize: bool = False) -> Iterator:
    """Yield once per batch of a compiled generator over the reader (ndd_trace_loop; with
    `checked`, the body with per-step Python: ndd_trace_checked; with `optimize`, compiled with
    optimize=True: ndd_trace_optimize), or over tiny's ExternalSource (ndd_trace_loop: how
    ndd_trace ran it, ndd_trace.explain's path, goes to `notes`)."""
    synchronize = options.device == "gpu"
    if workload == "tiny":
        import warnings

        import ndd_trace

        warnings.simplefilter("ignore")  # the checked-mode warning (see tiny_loop), once
        source = image_source(options, data)
        loop = ndd.compile(tiny_loop)
        while True:  # one pass over the source's batches per generator, as an epoch is
            for outputs in loop(source, len(data)):
                outputs.evaluate()
                if synchronize:
                    ndd.get_current_stream().synchronize()
                if "runs_as" not in notes:
                    notes["runs_as"] = ndd_trace.explain(loop).path
                yield
    if workload != "decode_rrc_cmn":
        raise NotImplementedError("compiled loops need a reader or an ExternalSource loop "
                                  "(decode_rrc_cmn, tiny)")
    reader = ndd.readers.File(
        file_root=str(data), random_shuffle=True, seed=options.seed, pad_last_batch=True
    )
    if checked:
        import warnings

        warnings.simplefilter("ignore")  # the checked-mode warning, once per process
        counted = ndd.compile(decode_rrc_cmn_loop_counted)
        seen = {"steps": 0}

        def loop(reader, batch_size, device):
            return counted(reader, batch_size, device, seen)
    else:
        loop = ndd.compile(decode_rrc_cmn_loop, optimize=optimize)
    while True:
        for outputs in loop(reader, options.batch_size, options.device):
            outputs.evaluate()
            if synchronize:
                ndd.get_current_stream().synchronize()
            yield


def dataloader_steps(workload, options, data) -> Iterator:
    """Yield once per batch of a torchvision DataLoader doing the decode workload's work."""
    import torch
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms import v2

    transform = v2.Compose([
        v2.RandomResizedCrop(224, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32),
        v2.Normalize(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]),
    ])
    paths = [str(path) for path in jpeg_paths(data)]

    class JpegDataset(torch.utils.data.Dataset):
        def __len__(self):
            return len(paths)

        def __getitem__(self, index):
            return transform(decode_jpeg(read_file(paths[index])))

    torch.manual_seed(options.seed)
    loader = torch.utils.data.DataLoader(
        JpegDataset(), batch_size=options.batch_size, shuffle=True, drop_last=True,
        num_workers=options.threads, persistent_workers=True, pin_memory=options.device == "gpu")
    while True:
        for images in loader:
            if options.device == "gpu":
                images = images.cuda(non_blocking=True)
                torch.cuda.synchronize()
            yield


def pipeline_mode_steps(workload, options, data, variant: str = "pipeline") -> Iterator:
    """Yield once per batch produced by the hand-written pipeline (or its `variant`)."""
    pipe = build_pipeline(workload, options, data, variant=variant)
    while True:
        pipe.run()  # outputs are synchronized with the host
        yield


def pipeline_percall_steps(workload, options, data, times: dict) -> Iterator:
    """Yield once per batch of the hand-built per-call pipeline: `feed_input` + `run` per step
    (what a per-call compiled function does at best); add the seconds spent in `feed_input`
    (`feed`) and `run` (`run`) to `times`."""
    from nvidia.dali.tensors import TensorListCPU

    pipe = build_pipeline(workload, options, data, percall=True)
    batches = [TensorListCPU(np.stack(batch), "HWC") for batch in data]
    clock = time.perf_counter
    for batch in itertools.cycle(batches):
        started = clock()
        pipe.feed_input("images", batch)
        fed = clock()
        pipe.run()  # outputs are synchronized with the host
        times["feed"] += fed - started
        times["run"] += clock() - fed
        yield


def measure(steps: Iterator, step_count: int, warmup_count: int, train_s: float = 0.0,
            on_timed_start: Callable | None = None, on_first: Callable | None = None) -> dict:
    """Time the first step, skip `warmup_count` more, then time `step_count` steps, each
    followed by a simulated training step of `train_s` seconds (data loading can overlap it)."""
    start = time.perf_counter()
    next(steps)
    first_batch_s = time.perf_counter() - start
    if on_first is not None:
        on_first()
    for _ in range(warmup_count):
        next(steps)
        if train_s:
            time.sleep(train_s)
    warmup_s = time.perf_counter() - start
    if on_timed_start is not None:
        on_timed_start()
    timed_start = time.perf_counter()
    for _ in range(step_count):
        next(steps)
        if train_s:
            time.sleep(train_s)
    elapsed = time.perf_counter() - timed_start
    steps.close()
    return {
        "steps_per_s": step_count / elapsed,
        "first_batch_s": first_batch_s,
        "warmup_s": warmup_s,
    }


def run_worker(mode: str, workload: str, options: argparse.Namespace) -> Result:
    """Run one mode of one workload in this process and return its measurement."""
    result = Result(workload, mode, "ok", options.batch_size, options.device)
    if options.device == "gpu":
        require_gpu()

    if mode == "ndd_trace_optimize" and options.hw_decoder_load is not None:
        # the same hardware decoder share as pipeline_fused's (not tuned: ndd_trace's tuning
        # chooses the share only where nothing sets it)
        os.environ["NDD_TRACE_HW_DECODER_LOAD"] = str(options.hw_decoder_load)
    if mode in ("ndd_trace", "ndd_trace_fed", "ndd_trace_loop", "ndd_trace_checked",
                "ndd_trace_optimize", "transparent"):
        if str(REPO_ROOT) not in sys.path:
            sys.path.append(str(REPO_ROOT))  # a checkout without `pip install -e .`
        try:
            import ndd_trace  # noqa: F401

            ndd.compile  # noqa: B018 (raises AttributeError when ndd_trace does not install it)
        except Exception as error:
            result.status = "unavailable"
            result.error = f"{type(error).__name__}: {error}"
            return result

    root = Path(options.data_dir)
    data = root
    if workload in IMAGE_SIDES:
        data = load_small_image_batches(root, options.batch_size, IMAGE_SIDES[workload],
                                        SOURCE_BATCHES.get(workload))
    ndd.set_num_threads(options.threads)
    ndd.random.set_seed(options.seed)

    notes: dict = {}
    times: dict = collections.defaultdict(float)
    if mode in ("pipeline_percall", "ndd_trace_fed") and workload not in IMAGE_SIDES:
        result.status = "unavailable"
        result.error = f"n/a: {mode} is for the ExternalSource workloads: {', '.join(IMAGE_SIDES)}"
        return result
    if mode in DECODE_ONLY_MODES and workload != "decode_rrc_cmn":
        result.status = "unavailable"
        result.error = f"n/a: {mode} is for decode_rrc_cmn"
        return result
    if mode == "pipeline_percall":
        steps = pipeline_percall_steps(workload, options, data, times)
    elif mode in PIPELINE_MODES:
        steps = pipeline_mode_steps(workload, options, data, mode)
    elif mode == "dataloader":
        try:
            import torchvision  # noqa: F401
        except ImportError as error:
            result.status = "unavailable"
            result.error = f"torchvision not installed ({error})"
            return result
        if workload != "decode_rrc_cmn":
            result.status = "unavailable"
            result.error = "n/a: the DataLoader comparison is for decode_rrc_cmn"
            return result
        steps = dataloader_steps(workload, options, data)
    elif mode in ("ndd_trace_loop", "ndd_trace_checked", "ndd_trace_optimize"):
        if workload != "decode_rrc_cmn" and not (workload == "tiny" and mode == "ndd_trace_loop"):
            result.status = "unavailable"
            result.error = "n/a: a compiled loop needs a reader (decode_rrc_cmn; tiny's " \
                           "ExternalSource: ndd_trace_loop)"
            return result
        steps = compiled_loop_steps(workload, options, data, notes, mode == "ndd_trace_checked",
                                    mode == "ndd_trace_optimize")
    elif mode == "transparent":  # the eager code, unmodified, under ndd_trace.enable()
        ndd_trace.enable()
        steps = dynamic_mode_steps(workload, options, data, "eager", notes, times)
    else:
        steps = dynamic_mode_steps(workload, options, data, mode, notes, times)
    before: dict = {}
    # where the first batch's time went in ndd_trace (ms): taking a generator apart, tracing,
    # passes and generated code (what a cache of traces kept across processes could save), and
    # pipeline builds (what it could not), from the times ndd_trace's trace and builds logs carry
    phases: dict = collections.defaultdict(float)
    first_phases: dict = {}

    class PhaseTimes(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            for phase, ms in getattr(record, "ndd_trace_ms", {}).items():
                phases[phase] += ms

    # what per-machine tuning did (optimize=True): its log, each line with the seconds since
    # the mode was set up
    tuning_log: list = []
    set_up = time.perf_counter()

    class TuningLog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            tuning_log.append(f"{time.perf_counter() - set_up:.2f}s {record.getMessage()}")

    if mode.startswith("ndd_trace") or mode == "transparent":
        for channel, handler in (("trace", PhaseTimes()), ("builds", PhaseTimes()),
                                 ("tuning", TuningLog())):
            logger = logging.getLogger(f"ndd_trace.{channel}")
            logger.setLevel(logging.INFO)
            logger.addHandler(handler)
            logger.propagate = False  # counted, not printed

    def on_first():
        first_phases.update(phases)

    def on_timed_start():
        times.update(dict.fromkeys(times, 0.0))
        if mode == "transparent":
            before.update(ndd_trace.modes.lazy.step_breakdown())

    timing = measure(steps, options.steps, options.warmup, options.train_ms / 1000.0,
                     on_timed_start, on_first)
    if first_phases:
        result.extra["first_batch_ms"] = dict(first_phases)
        notes["first"] = ", ".join(f"{phase} {ms:.0f}" for phase, ms in first_phases.items())
    # where a step's time goes (ms per timed step): the loop's own split (source, call, consume;
    # feed, run for the hand-built per-call pipeline), then transparent mode's stages
    breakdown = {stage: seconds * 1000 / options.steps for stage, seconds in times.items()}
    if mode == "transparent":
        after = ndd_trace.modes.lazy.step_breakdown()
        breakdown.update({stage: (after[stage] - before.get(stage, 0.0)) * 1000 / options.steps
                          for stage in after})
    if breakdown:
        breakdown["step"] = 1000 / timing["steps_per_s"]
        result.extra["breakdown_ms"] = breakdown
        notes["breakdown"] = ", ".join(f"{stage} {ms:.2f}" for stage, ms in breakdown.items())

    result.steps, result.warmup = options.steps, options.warmup
    result.steps_per_s = timing["steps_per_s"]
    result.samples_per_s = timing["steps_per_s"] * options.batch_size
    result.first_batch_s = timing["first_batch_s"]
    result.warmup_s = timing["warmup_s"]
    if "breakdown" in notes:
        result.notes = f"ms/step: {notes['breakdown']}"
    if "first" in notes:
        first = f"first batch ms: {notes['first']}"
        result.notes = f"{result.notes}; {first}" if result.notes else first
    if "runs_as" in notes:
        runs_as = f"runs as: {notes['runs_as']}"
        result.notes = f"{result.notes}; {runs_as}" if result.notes else runs_as
    if "captured_ops" in notes:
        names = notes["captured_ops"]
        captured = f"captured {len(names)} ops: {', '.join(names)}"
        result.notes = f"{result.notes}; {captured}" if result.notes else captured
        result.extra["captured_ops"] = names
    if tuning_log:
        result.extra["tuning"] = tuning_log
        last = tuning_log[-1].split(": ", 1)[-1]  # (without the pipeline's file name)
        result.notes = f"{result.notes}; tuning: {last}" if result.notes else f"tuning: {last}"
    # the process's peak resident memory (issue 34's goal: at most 1.2x the pipeline's)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (KiB on Linux)
    result.extra["peak_rss_mib"] = peak_rss_mib
    result.notes = f"peak RSS {peak_rss_mib:.0f} MiB; {result.notes}".rstrip("; ")
    return result


# --------------------------------------------------------------------------------------------
# Parent: run every (workload, mode) in its own subprocess and print a table.
# --------------------------------------------------------------------------------------------


def worker_command(mode: str, workload: str, options: argparse.Namespace) -> list[str]:
    """Return the command line that re-invokes this script as a worker."""
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        mode,
        workload,
        "--device",
        options.device,
        "--steps",
        str(options.steps),
        "--warmup",
        str(options.warmup),
        "--batch-size",
        str(options.batch_size),
        "--threads",
        str(options.threads),
        "--seed",
        str(options.seed),
        "--data-dir",
        str(options.data_dir),
        "--train-ms",
        str(options.train_ms),
    ] + (["--hw-decoder-load", str(options.hw_decoder_load)]
         if options.hw_decoder_load is not None else [])


def run_in_subprocess(mode: str, workload: str, options: argparse.Namespace) -> Result:
    """Run one worker subprocess and parse its result line."""
    command = worker_command(mode, workload, options)
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=options.timeout, cwd=REPO_ROOT
        )
    except subprocess.TimeoutExpired:
        return Result(
            workload,
            mode,
            "failed",
            options.batch_size,
            options.device,
            error=f"timed out after {options.timeout} s",
        )
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return Result(**json.loads(line[len(RESULT_PREFIX) :]))
    output_lines = (completed.stderr or completed.stdout).strip().splitlines()
    last_line = output_lines[-1] if output_lines else f"exit code {completed.returncode}"
    if options.verbose:
        print(completed.stderr, file=sys.stderr)
    return Result(
        workload, mode, "failed", options.batch_size, options.device, error=last_line.strip()
    )


def ratio(value: float | None, base: float | None) -> str:
    """Format value / base as '1.23x', or '-' when either is missing."""
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def print_table(results: list[Result]) -> None:
    """Print one block per workload: steps/s, samples/s, ratios and time to first batch."""
    header = (
        f"{'mode':<18} {'steps/s':>9} {'samples/s':>10} {'vs eager':>9} {'vs pipeline':>12} "
        f"{'vs per-call pipe':>17} {'vs decode-only':>15} {'first batch':>12} {'warm-up':>9}  "
        "notes"
    )
    for workload in dict.fromkeys(result.workload for result in results):
        rows = [result for result in results if result.workload == workload]
        by_mode = {result.mode: result.steps_per_s for result in rows if result.status == "ok"}
        first = rows[0]
        print(
            f"\n{workload} (batch {first.batch_size}, device {first.device}, "
            f"{first.steps or '?'} timed steps)"
        )
        print(header)
        print("-" * len(header))
        for result in rows:
            if result.status != "ok":
                print(f"{result.mode}: {result.status} ({result.error})")
                continue
            print(
                f"{result.mode:<18} {result.steps_per_s:>9.1f} {result.samples_per_s:>10.1f} "
                f"{ratio(result.steps_per_s, by_mode.get('eager')):>9} "
                f"{ratio(result.steps_per_s, by_mode.get('pipeline')):>12} "
                f"{ratio(result.steps_per_s, by_mode.get('pipeline_percall')):>17} "
                f"{ratio(result.steps_per_s, by_mode.get('decode_only')):>15} "
                f"{result.first_batch_s * 1000:>10.1f}ms {result.warmup_s:>8.2f}s  {result.notes}"
            )


def parse_list(text: str, choices: tuple[str, ...], what: str) -> list[str]:
    """Parse a comma-separated list, checking every item against `choices`."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if item not in choices]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(choices)})"
        )
    return items


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line of both the parent and the worker."""
    parser = argparse.ArgumentParser(
        description="Compare eager dynamic mode, capture mode, ndd_trace and pipeline mode.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        type=lambda text: parse_list(text, WORKLOADS, "workload"),
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), type=lambda text: parse_list(text, MODES, "mode")
    )
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per mode")
    parser.add_argument(
        "--warmup",
        type=int,
        default=20,
        help="untimed steps after the first batch (which is timed separately)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="batch size (default: 8 for small_ops and tiny, 16 for decode_rrc_cmn)",
    )
    parser.add_argument(
        "--threads", type=int, default=min(4, os.cpu_count() or 1), help="DALI CPU worker threads"
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--train-ms", type=float, default=0.0,
                        help="simulated training step after each batch (milliseconds)")
    parser.add_argument("--hw-decoder-load", type=float, default=None,
                        help="the GPU decoder's hw_decoder_load in pipeline_fused, decode_only and "
                             "fused_decode_only "
                             f"(default {FUSED_HW_DECODER_LOAD}), and in ndd_trace_optimize "
                             "(default: ndd_trace's, tuned per machine with a cache directory);"
                             " pipeline keeps DALI's default, 0.65")
    parser.add_argument("--images", type=int, default=256, help="JPEG files in the data set")
    parser.add_argument(
        "--data-dir",
        default=None,
        help="JPEG directory (default: a cached directory under the temp dir)",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds per worker")
    parser.add_argument("--json", dest="json_path", default=None, help="write raw results here")
    parser.add_argument("--verbose", action="store_true", help="show the stderr of failed workers")
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "WORKLOAD"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.steps < 1 or options.warmup < 0:
        parser.error("--steps must be at least 1 and --warmup at least 0")
    if options.worker:
        mode, workload = options.worker
        if mode not in MODES or workload not in WORKLOADS:
            parser.error(f"bad worker mode/workload: {mode} {workload}")
    return options


def main(argv: list[str] | None = None) -> int:
    """Run the parent (all workloads and modes) or, with --worker, one measurement."""
    options = parse_arguments(argv)
    if options.worker:
        mode, workload = options.worker
        if options.batch_size is None:
            options.batch_size = DEFAULT_BATCH_SIZES[workload]
        result = run_worker(mode, workload, options)
        print(RESULT_PREFIX + json.dumps(asdict(result)), flush=True)
        return 0

    if options.device == "gpu":
        require_gpu()
    if options.data_dir is None:
        options.data_dir = str(
            Path(tempfile.gettempdir()) / f"ndd_trace_bench_jpegs_{options.images}_{options.seed}"
        )
    make_jpeg_dir(options.data_dir, n=options.images, seed=options.seed)

    requested_batch_size = options.batch_size
    results = []
    for workload in options.workloads:
        options.batch_size = requested_batch_size or DEFAULT_BATCH_SIZES[workload]
        for mode in options.modes:
            print(f"running {workload} / {mode} ...", file=sys.stderr, flush=True)
            results.append(run_in_subprocess(mode, workload, options))
    options.batch_size = requested_batch_size

    print_table(results)
    if options.json_path:
        from nvidia.dali import __version__ as dali_version

        report = {
            "config": {
                key: value for key, value in vars(options).items() if key not in ("worker",)
            },
            "machine": {
                "cpu_count": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "dali": dali_version,
            },
            "results": [asdict(result) for result in results],
        }
        Path(options.json_path).write_text(json.dumps(report, indent=2))
        print(f"\nraw results written to {options.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
