"""The hit path of a compiled call: issue 34's tiny step (13 ops) compiled and called after a
warm-up; the call's time and its result's (consume) a step, and a cProfile of the calls.

    PYTHONPATH=. python benchmarks/probe_hit_path.py [--device gpu] [--data user|owned|source]
        [--calls 400] [--profile 18]

`--data user`: batches made with `ndd.as_batch(arrays)` (user data: eager ndd runs the first op
at the call, so the compiled call waits for its run, to raise a failure there as eagerly);
`owned`: the same batches copied by a DALI op first (DALI-owned: nothing runs at the call);
`source`: taken from an `ndd.ExternalSource` over them, as bench_ops.py's tiny workload does.
"""
import argparse
import cProfile
import pstats
import statistics
import time

import numpy as np
import nvidia.dali.experimental.dynamic as ndd

import ndd_trace


def tiny_step(x, bs):
    x = ndd.flip(x, horizontal=1); x = ndd.crop(x, crop=[28, 28]); x = ndd.resize(x, size=[32, 32])
    x = ndd.transpose(x, perm=[2, 0, 1]); x = ndd.transpose(x, perm=[1, 2, 0])
    x = ndd.brightness_contrast(x, brightness=1.1, contrast=0.9)
    x = ndd.hsv(x, hue=10.0, saturation=1.1)
    x = ndd.pad(x, axis_names="HW", shape=[36, 36]); x = ndd.crop(x, crop=[32, 32])
    x = ndd.cast(x, dtype=ndd.float32); x = ndd.flip(x, vertical=1)
    mirror = ndd.random.coin_flip(batch_size=bs)
    return ndd.crop_mirror_normalize(x, mirror=mirror, dtype=ndd.float32, output_layout="CHW",
                                     mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--data", default="user", choices=("user", "owned", "source"))
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--profile", type=int, default=18, help="rows of the profile (0: none)")
    options = parser.parse_args()
    device = "cpu" if options.data == "source" else options.device
    batches = [ndd.as_batch([np.full((32, 32, 3), i + j, np.uint8) for j in range(8)],
                            layout="HWC", device=device) for i in range(20)]
    if options.data == "owned":
        batches = [ndd.copy(batch).evaluate() for batch in batches]
    elif options.data == "source":
        source = ndd.ExternalSource(batches, cycle="quiet", device=options.device)
        batches = [source() for _ in range(20)]
    fast = ndd_trace.compile(tiny_step)
    started = time.perf_counter()
    fast(batches[0], 8).evaluate()
    print(f"first call and result: {(time.perf_counter() - started) * 1e3:.0f} ms")
    for index in range(100):
        fast(batches[index % 20], 8).evaluate()
    calls, consumes = [], []
    for block in range(options.calls // 20):
        call = consume = 0.0
        for index in range(20):
            started = time.perf_counter()
            result = fast(batches[index], 8)
            called = time.perf_counter()
            result.evaluate()
            if options.device == "gpu":
                ndd.get_current_stream().synchronize()
            consume += time.perf_counter() - called
            call += called - started
        calls.append(call / 20 * 1e6)
        consumes.append(consume / 20 * 1e6)
    print(f"{options.device}, {options.data} data: call {statistics.median(calls):.0f} us "
          f"(min {min(calls):.0f}), consume {statistics.median(consumes):.0f} us a step "
          f"(medians of {len(calls)} blocks of 20 calls)")
    if options.profile:
        profile = cProfile.Profile()
        for index in range(options.calls):
            profile.enable()
            result = fast(batches[index % 20], 8)
            profile.disable()
            result.evaluate()
        stats = pstats.Stats(profile)
        print(f"{stats.total_calls / options.calls:.0f} Python calls a call")
        stats.sort_stats("cumulative").print_stats(options.profile)


if __name__ == "__main__":
    main()
