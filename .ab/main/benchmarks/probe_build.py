"""What a GPU-decoder pipeline's build costs, on a GPU machine: the first build in a process, a
rebuild with other settings, the runs after it, freeing a pipeline, and whether a build in
another thread stops a loop that runs a built pipeline (DALI holding the GIL while it builds).
Per-machine tuning (docs/optimize.md) builds each setting it tries, so this is its price.

    python3 benchmarks/probe_build.py          # prints one line per measurement
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import load_jpeg_bytes, make_jpeg_dir  # noqa: E402
from nvidia.dali import fn, pipeline_def, types  # noqa: E402

BATCH = 256
jpegs = load_jpeg_bytes(make_jpeg_dir("/tmp/probe_jpegs", n=BATCH))


@pipeline_def
def decode_crop(load):
    encoded = fn.external_source(name="x", dtype=types.UINT8, ndim=1)
    images = fn.decoders.image(encoded, device="mixed", hw_decoder_load=load)
    images = fn.random_resized_crop(images, size=[224, 224], seed=1)
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT16)


def build(load: float = 0.65, threads: int = 16):
    started = time.perf_counter()
    pipe = decode_crop(load, batch_size=BATCH, num_threads=threads, device_id=0,
                       prefetch_queue_depth=1, exec_dynamic=True)
    pipe.build()
    return pipe, time.perf_counter() - started


def step(pipe) -> float:
    started = time.perf_counter()
    pipe.feed_input("x", jpegs[:BATCH])
    pipe.run()
    return time.perf_counter() - started


def runs(pipe, count: int = 6) -> str:
    return " ".join(f"{step(pipe):.4f}" for _ in range(count))


def main() -> None:
    pipe, seconds = build()
    print(f"first build {seconds:.3f} s")
    print("first runs (s):", runs(pipe))
    print(f"steady step median {statistics.median(step(pipe) for _ in range(30)) * 1000:.2f} ms")
    for load, threads in ((0.9, 16), (0.65, 8)):
        other, seconds = build(load, threads)
        print(f"rebuild load={load} threads={threads}: build {seconds:.3f} s; first runs",
              runs(other))
        del other
    built: list = []
    thread = threading.Thread(target=lambda: built.append(build(1.0, 16)))
    during = []
    thread.start()
    started = time.perf_counter()
    while thread.is_alive():
        during.append(step(pipe))
    print(f"threaded build {built[0][1]:.3f} s; loop ran {len(during)} steps meanwhile in "
          f"{time.perf_counter() - started:.3f} s, median {statistics.median(during) * 1000:.2f}"
          f" ms, max {max(during) * 1000:.1f} ms")
    other = built[0][0]
    print("its first runs (s):", runs(other))
    started = time.perf_counter()
    del other
    built.clear()
    gc.collect()
    print(f"free {time.perf_counter() - started:.3f} s")
    profile = cProfile.Profile()
    profile.enable()
    other, seconds = build(0.9, 16)
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    print(f"profiled build {seconds:.3f} s, of which Python {stats.total_tt:.3f} s")


if __name__ == "__main__":
    main()
