"""The ceiling of coalescing (issue 34, item 4) on the tiny loop, and whether it can be exact.

K consecutive steps of batch N run as one pipeline run. `probe_random_state.py` showed that a
random op reads only its batch's first `_random_state`, so one op over K x N samples cannot
give K calls' values. This probe measures three ways of running K steps at once beside the
prefetching batch-N pipeline, in steps (N samples) per second, one process:

- `coalesced`: the whole chain at batch K x N, one coin flip (NOT eager's values: the ceiling);
- `sliced`: the deterministic ops at batch K x N, the random op once per step on its slice
  (DALI's conditional split by sample index, its own fed state, merged back): eager's values;
- `copies`: K copies of the whole chain at batch N in one pipeline, each fed its step's batch
  and state: eager's values.

It first checks that `sliced` and `copies` give eager ndd's K results bit for bit (same RNG):

    PYTHONPATH=. python benchmarks/probe_coalesce.py --device cpu --ks 1 2 4 8

`--workload train` times the train workload's ops the same way (a File reader, not shuffled,
at batch K x N; the decoder and normalize over the whole run; random_resized_crop and the coin
flip once per step on its slice), beside the batch-N and batch-K x N pipelines (timing only):

    PYTHONPATH=. python benchmarks/probe_coalesce.py --device gpu --workload train --batch-size 32
"""
import argparse
import itertools
import time

import numpy as np
from nvidia.dali import fn, pipeline_def, types
import nvidia.dali.experimental.dynamic as ndd
from nvidia.dali.experimental.dynamic import random as ndd_random

MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def tiny_step(x, bs, rng):
    """Issue 34's tiny step, eagerly (the coin flip drawn from `rng`)."""
    x = ndd.flip(x, horizontal=1); x = ndd.crop(x, crop=[28, 28]); x = ndd.resize(x, size=[32, 32])
    x = ndd.transpose(x, perm=[2, 0, 1]); x = ndd.transpose(x, perm=[1, 2, 0])
    x = ndd.brightness_contrast(x, brightness=1.1, contrast=0.9); x = ndd.hsv(x, hue=10.0, saturation=1.1)
    x = ndd.pad(x, axis_names="HW", shape=[36, 36]); x = ndd.crop(x, crop=[32, 32])
    x = ndd.cast(x, dtype=ndd.float32); x = ndd.flip(x, vertical=1)
    mirror = ndd.random.coin_flip(batch_size=bs, rng=rng)
    return ndd.crop_mirror_normalize(x, mirror=mirror, dtype=ndd.float32, output_layout="CHW",
                                     mean=MEAN, std=STD)


def deterministic_part(x):
    x = fn.flip(x, horizontal=1); x = fn.crop(x, crop=[28, 28]); x = fn.resize(x, size=[32, 32])
    x = fn.transpose(x, perm=[2, 0, 1]); x = fn.transpose(x, perm=[1, 2, 0])
    x = fn.brightness_contrast(x, brightness=1.1, contrast=0.9); x = fn.hsv(x, hue=10.0, saturation=1.1)
    x = fn.pad(x, axis_names="HW", shape=[36, 36]); x = fn.crop(x, crop=[32, 32])
    x = fn.cast(x, dtype=types.FLOAT)
    return fn.flip(x, vertical=1)


def normalize(x, mirror):
    return fn.crop_mirror_normalize(x, mirror=mirror, dtype=types.FLOAT, output_layout="CHW",
                                    mean=MEAN, std=STD)


def slices(data, index, k, n, lo=0, hi=None):
    """`data`'s slices of N samples for calls lo .. hi - 1 (by each sample's index in the run),
    split in a balanced tree (as ndd_trace/codegen/coalesce.py), and the predicates that merge
    them back ({(lo, hi): predicate})."""
    hi = k if hi is None else hi
    if hi - lo == 1:
        return [data], {}
    mid = (lo + hi) // 2
    predicate = index < mid * n
    first, second = fn._conditional.split(data, predicate=predicate)
    first_index, second_index = fn._conditional.split(index, predicate=predicate)
    parts, predicates = slices(first, first_index, k, n, lo, mid)
    more, more_predicates = slices(second, second_index, k, n, mid, hi)
    return parts + more, {**predicates, **more_predicates, (lo, hi): predicate}


def merged(parts, predicates, lo=0):
    if len(parts) == 1:
        return parts[0]
    half = len(parts) // 2
    return fn._conditional.merge(merged(parts[:half], predicates, lo),
                                 merged(parts[half:], predicates, lo + half),
                                 predicate=predicates[(lo, lo + len(parts))])


def make_pipeline(way, k, n, device, threads, sources):
    """`sources`: callables giving each run's images (a list of K x N or N arrays) and states."""
    batch = n if way in ("pipeline", "copies") else k * n
    images_source, states_source, index_source = sources

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if device == "gpu" else None,
                  prefetch_queue_depth=2, seed=1234, enable_conditionals=False)
    def definition():
        if way == "copies":
            outs = []
            for step in range(k):
                x = fn.external_source(source=images_source(step), batch=True, layout="HWC",
                                       device=device)
                state = fn.external_source(source=states_source(step), batch=True)
                mirror = fn.random.coin_flip(_random_state=state)
                outs.append(normalize(deterministic_part(x), mirror))
            return tuple(outs)
        x = fn.external_source(source=images_source(None), batch=True, layout="HWC", device=device)
        state = fn.external_source(source=states_source(None), batch=True)
        if way in ("pipeline", "coalesced"):
            return normalize(deterministic_part(x), fn.random.coin_flip(_random_state=state))
        index = fn.external_source(source=index_source, batch=True)
        state_parts, predicates = slices(state, index, k, n)
        index_parts, _ = slices(index, index, k, n)
        flips = [fn.random.coin_flip(i, _random_state=s) for i, s in zip(index_parts, state_parts)]
        return normalize(deterministic_part(x), merged(flips, predicates))

    pipe = definition()
    pipe.build()
    return pipe


def make_train_pipeline(way, k, n, device, threads, root, states):
    """The train workload's ops over `root`'s JPEGs; `sliced`: its random ops per step."""
    batch = n if way == "pipeline" else k * n
    cycle = itertools.count()

    def states_source():
        run = next(cycle)
        if way == "pipeline":
            return [states[run % len(states)]] * n
        return [states[(run * k + s) % len(states)] for s in range(k) for _ in range(n)]

    index = [np.array(i, dtype=np.int32) for i in range(batch)]

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if device == "gpu" else None,
                  prefetch_queue_depth=2, seed=1234)
    def definition():
        jpegs, _ = fn.readers.file(file_root=str(root), random_shuffle=False, name="Reader")
        images = fn.decoders.image(jpegs, device="mixed" if device == "gpu" else "cpu")
        state = fn.external_source(source=states_source, batch=True)
        if way != "sliced":
            images = fn.random_resized_crop(images, size=[224, 224], _random_state=state)
            return normalize(images, fn.random.coin_flip(_random_state=state))
        indices = fn.external_source(source=lambda: index, batch=True)
        image_parts, predicates = slices(images, indices, k, n)
        state_parts, _ = slices(state, indices, k, n)
        index_parts, _ = slices(indices, indices, k, n)
        crops = [fn.random_resized_crop(i, size=[224, 224], _random_state=s)
                 for i, s in zip(image_parts, state_parts)]
        flips = [fn.random.coin_flip(i, _random_state=s) for i, s in zip(index_parts, state_parts)]
        return normalize(merged(crops, predicates), merged(flips, predicates))

    pipe = definition()
    pipe.build()
    return pipe


def steps_per_second(pipe, way, k, runs, warmup):
    """Steps (calls of batch N) per second over `runs` runs of `pipe`, after `warmup`."""
    for _ in range(warmup):
        pipe.run()
    started = time.perf_counter()
    for _ in range(runs):
        pipe.run()
    elapsed = time.perf_counter() - started
    return runs * (1 if way == "pipeline" else k) / elapsed


def train_rate(way, k, n, device, threads, root, runs, warmup):
    pipe = make_train_pipeline(way, k, n, device, threads, root, draw_states(11, 64))
    return steps_per_second(pipe, way, k, runs, warmup)


def draw_states(seed, count):
    rng = ndd_random.RNG(seed=seed)
    return [np.array(ndd_random._draw_state(rng), dtype=np.uint32) for _ in range(count)]


def sources_for(batches, states, k, n, way):
    """Cycling sources: each run's images, states (one per sample: its step's) and indices."""
    index = [np.array(i, dtype=np.int32) for i in range(k * n)]

    def cycling(items_of_run, step):
        runs = itertools.count()

        def source():
            run = next(runs)
            return items_of_run(run, step)
        return source

    def images_of(run, step):
        if step is not None or way == "pipeline":
            first = run * k + (step or 0) if step is not None else run
            return batches[first % len(batches)]
        return [a for s in range(k) for a in batches[(run * k + s) % len(batches)]]

    def states_of(run, step):
        if step is not None or way == "pipeline":
            first = run * k + (step or 0) if step is not None else run
            return [states[first % len(states)]] * n
        return [states[(run * k + s) % len(states)] for s in range(k) for _ in range(n)]

    return (lambda step: cycling(images_of, step), lambda step: cycling(states_of, step),
            lambda: index)


def outputs_of(pipe, way, k):
    outs = pipe.run()
    if way == "copies":
        return [np.stack([np.array(o.as_cpu()[i]) for i in range(len(o))]) for o in outs]
    (o,) = outs
    o = o.as_cpu()
    return np.stack([np.array(o[i]) for i in range(len(o))])


def check_exact(batches, k, n, device, threads):
    """Eager ndd's K steps against each exact way's one run (the same RNG's states)."""
    rng = ndd_random.RNG(seed=7)
    eager = []
    for step in range(k):
        x = ndd.as_batch(batches[step], layout="HWC", device=device)
        out = tiny_step(x, n, rng)
        eager.append(np.stack([np.array(t) for t in ndd.as_batch(out).cpu()]))
    states = draw_states(7, k)
    verdict = {}
    for way in ("sliced", "copies"):
        pipe = make_pipeline(way, k, n, device, threads,
                             sources_for(batches, states, k, n, way))
        got = outputs_of(pipe, way, k)
        got = got if way == "copies" else np.split(got, k)
        verdict[way] = all(np.array_equal(a, b) for a, b in zip(eager, got))
    return verdict


def rate(batches, way, k, n, device, threads, runs, warmup):
    states = draw_states(11, len(batches))
    pipe = make_pipeline(way, k, n, device, threads, sources_for(batches, states, k, n, way))
    return steps_per_second(pipe, way, k, runs, warmup)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=800, help="steps timed per way and K")
    parser.add_argument("--workload", default="tiny", choices=("tiny", "train"))
    parser.add_argument("--images", type=int, default=4096, help="train: JPEGs in the reader")
    parser.add_argument("--data-dir", default="/tmp/ndd_trace_bench_jpegs")
    args = parser.parse_args()
    n = args.batch_size
    if args.workload == "train":
        return main_train(args)
    data = np.random.default_rng(0).integers(0, 256, size=(200, n, 32, 32, 3), dtype=np.uint8)
    batches = [list(b) for b in data]
    for k in args.ks:
        if k > 1:
            print(f"K={k}: bit for bit eager's: {check_exact(batches, k, n, args.device, args.threads)}")
    base = rate(batches, "pipeline", 1, n, args.device, args.threads, args.steps, args.steps // 8)
    print(f"pipeline, batch {n}: {base:.0f} steps/s")
    for k in args.ks:
        for way in ("coalesced", "sliced", "copies"):
            runs = max(args.steps // k, 20)
            r = rate(batches, way, k, n, args.device, args.threads, runs, max(runs // 8, 2))
            print(f"K={k} {way:9s}: {r:7.0f} steps/s  {r / base:5.2f}x the batch-{n} pipeline")


def main_train(args):
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _data import make_jpeg_dir
    root = make_jpeg_dir(args.data_dir, n=args.images, seed=0)
    n = args.batch_size
    steps = args.steps

    def timed(way, k):
        runs = max(steps // (1 if way == "pipeline" else k), 10)
        return train_rate(way, k, n, args.device, args.threads, root, runs, max(runs // 5, 3))

    base = timed("pipeline", 1)
    print(f"train, pipeline, batch {n}: {base * n:.0f} img/s")
    for k in args.ks:
        for way in ("coalesced", "sliced"):
            r = timed(way, k)
            print(f"train K={k} {way:9s}: {r * n:7.0f} img/s  {r / base:5.2f}x the batch-{n} pipeline")


if __name__ == "__main__":
    main()
