"""Where the first batch's time goes on a GPU machine, each case in a fresh process.

- ``plain``: a GPU-decoder pipeline's first build and first run, nothing before them;
- ``cuinit``: the CUDA driver's set-up alone (``cuInit`` and the device's primary context,
  through ctypes), then the same build and run: how much of the build is that set-up;
- ``overlap``: the same set-up in a thread while the main thread runs Python for as long: whether
  it lets the GIL go (the Python's progress against the same Python alone);
- ``step``: the train workload's compiled step (``@ndd.compile`` in an eager reader loop), its
  first batch under cProfile, split by phase, and the functions that took longest (run twice
  with one ``NDD_TRACE_CACHE_DIR``: cold, then warm).

    python3 benchmarks/probe_first_batch.py            # every case, twice
    python3 benchmarks/probe_first_batch.py step       # one case, in this process
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCHMARK_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARK_DIR))
BATCH = 256
JPEG_DIR = "/tmp/probe_jpegs_first"


def driver_set_up() -> float:
    """cuInit and the primary context of device 0, through the driver API; seconds taken."""
    started = time.perf_counter()
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    device = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
    context = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
    return time.perf_counter() - started


def build_and_run() -> tuple[float, float]:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def decode_crop():
        jpegs, _ = fn.readers.file(file_root=JPEG_DIR, random_shuffle=True, seed=1)
        images = fn.decoders.image(jpegs, device="mixed")
        images = fn.random_resized_crop(images, size=[224, 224], seed=1)
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT)

    started = time.perf_counter()
    pipe = decode_crop(batch_size=BATCH, num_threads=16, device_id=0, exec_dynamic=True)
    pipe.build()
    built = time.perf_counter()
    pipe.run()
    return built - started, time.perf_counter() - built


def python_work(seconds: float) -> int:
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        count += sum(range(200))  # Python bytecode: needs the GIL
    return count


def case_plain() -> None:
    import nvidia.dali  # noqa: F401  (imported before the clock, as in the other cases)

    build, run = build_and_run()
    print(f"plain: build {build:.3f} s, first run {run:.3f} s")


def case_cuinit() -> None:
    import nvidia.dali  # noqa: F401

    set_up = driver_set_up()
    build, run = build_and_run()
    print(f"cuinit: driver set-up {set_up:.3f} s, then build {build:.3f} s, first run {run:.3f} s")


def case_overlap() -> None:
    import nvidia.dali  # noqa: F401

    alone = python_work(0.3)
    took: list = []
    thread = threading.Thread(target=lambda: took.append(driver_set_up()))
    started = time.perf_counter()
    thread.start()
    during = python_work(0.3)
    thread.join()
    waited = time.perf_counter() - started
    build, run = build_and_run()
    print(f"overlap: driver set-up {took[0]:.3f} s in a thread; Python meanwhile ran at "
          f"{during / alone:.2f}x its speed alone; set-up + join {waited:.3f} s; then build "
          f"{build:.3f} s, first run {run:.3f} s")


def case_step() -> None:
    import cProfile
    import logging
    import pstats

    started = time.perf_counter()
    import nvidia.dali.experimental.dynamic as ndd

    import ndd_trace  # noqa: F401
    from bench_ops import decode_rrc_cmn_gpu

    phases: dict = {}

    class Phases(logging.Handler):
        def emit(self, record):
            for phase, ms in getattr(record, "ndd_trace_ms", {}).items():
                phases[phase] = phases.get(phase, 0.0) + ms

    for channel in ("trace", "builds"):
        logger = logging.getLogger(f"ndd_trace.{channel}")
        logger.setLevel(logging.INFO)
        logger.addHandler(Phases())
        logger.propagate = False
    imported = time.perf_counter()
    profile = cProfile.Profile()
    profile.enable()
    set_up = time.perf_counter()
    step = ndd.compile(decode_rrc_cmn_gpu)
    reader = ndd.readers.File(file_root=JPEG_DIR, random_shuffle=True, seed=1,
                              pad_last_batch=True)
    epoch = iter(reader.next_epoch(batch_size=BATCH))
    jpegs, _ = next(epoch)
    read = time.perf_counter()
    outputs = step(jpegs)
    outputs.evaluate()
    ndd.get_current_stream().synchronize()
    done = time.perf_counter()
    profile.disable()
    print(f"step: imports {imported - started:.3f} s; first batch {done - set_up:.3f} s: reader "
          f"{read - set_up:.3f} s, step {done - read:.3f} s ("
          + ", ".join(f"{phase} {ms:.0f} ms" for phase, ms in phases.items()) + ")")
    stats = pstats.Stats(profile, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(28)
    stats.sort_stats("tottime").print_stats(12)


CASES = {"plain": case_plain, "cuinit": case_cuinit, "overlap": case_overlap, "step": case_step}


def main() -> None:
    if len(sys.argv) > 1:
        CASES[sys.argv[1]]()
        return
    from _data import make_jpeg_dir

    make_jpeg_dir(JPEG_DIR, n=1024)
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NDD_TRACE_CACHE_DIR=cache)
        for _round in range(2):
            for case in CASES:
                subprocess.run([sys.executable, __file__, case], env=env, check=False)


if __name__ == "__main__":
    main()
