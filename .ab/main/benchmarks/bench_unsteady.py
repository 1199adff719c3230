"""Programs whose steps do not repeat: eager ndd beside ndd_trace, each in a fresh process.

    python benchmarks/bench_unsteady.py --device cpu --steps 200 [--json out.json]

ndd_trace must never be slower than eager ndd. These are the shapes of a new-user trial's two
programs that were (issue 34): a RandAugment whose Python picks two ops and their magnitudes at
every step, inside the step (`randaug_inside`, Python's `random`: the step runs in transparent
mode) or in the loop, passed to the step as arguments (`randaug_args`: each step a new variant),
and a loop that catches per-step decode errors (`caught_errors`: every fourth batch holds a
corrupt JPEG). Each decodes real JPEGs (benchmarks/_data.py). Modes: `eager` (plain ndd),
`compiled` (the step under `ndd_trace.compile`, called from the eager loop), `transparent`
(the loop inside `ndd_trace.enabled()`). Printed: steps/s and the ratio to eager.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ("randaug_inside", "randaug_args", "caught_errors")
MODES = ("eager", "compiled", "transparent")
BATCH = 8


def _ops(ndd):
    """RandAugment's menu: name -> op of (images, magnitude 1-9)."""
    return {
        "rotate": lambda x, m: ndd.rotate(x, angle=float(3 * m), keep_size=True),
        "brightness": lambda x, m: ndd.brightness(x, brightness=1.0 + m / 30),
        "contrast": lambda x, m: ndd.contrast(x, contrast=1.0 + m / 30),
        "hue": lambda x, m: ndd.hue(x, hue=float(2 * m)),
        "saturation": lambda x, m: ndd.saturation(x, saturation=1.0 + m / 30),
        "flip": lambda x, m: ndd.flip(x, horizontal=1),
        "crop": lambda x, m: ndd.resize(ndd.crop(x, crop=[96 - 4 * m, 96 - 4 * m]), size=[96, 96]),
        "water": lambda x, m: ndd.water(x, ampl_x=float(m)),
    }


def _program(name: str, mode: str, device: str, steps: int, data: list) -> float:
    """Seconds a step of `name` in `mode`."""
    import numpy as np
    import nvidia.dali.experimental.dynamic as ndd

    import ndd_trace

    ops = _ops(ndd)
    decoder_device = device  # (ndd names the mixed decoder "gpu")

    def decode(jpegs):
        return ndd.resize(ndd.decoders.image(jpegs, device=decoder_device), size=[96, 96])

    def randaug_inside(jpegs):
        images = decode(jpegs)
        for op in random.sample(sorted(ops), 2):
            images = ops[op](images, random.randint(1, 9))
        return images

    def randaug_args(jpegs, names, magnitudes):
        images = decode(jpegs)
        for op, magnitude in zip(names, magnitudes):
            images = ops[op](images, magnitude)
        return images

    def caught(jpegs):
        return ndd.flip(decode(jpegs), horizontal=1)

    step = {"randaug_inside": randaug_inside, "randaug_args": randaug_args,
            "caught_errors": caught}[name]
    if mode == "compiled":
        step = ndd_trace.compile(step)
    batches = [ndd.as_batch(data[i:i + BATCH]) for i in range(0, len(data) - BATCH + 1, BATCH)]
    corrupt = ndd.as_batch([np.frombuffer(b"not a jpeg", dtype=np.uint8)] + data[1:BATCH])

    def one(index: int) -> None:
        if name == "caught_errors":
            jpegs = corrupt if index % 4 == 3 else batches[index % len(batches)]
            try:
                np.asarray(step(jpegs).select(0).cpu())
            except RuntimeError:
                pass
            return
        jpegs = batches[index % len(batches)]
        if name == "randaug_args":
            names = tuple(random.sample(sorted(ops), 2))
            out = step(jpegs, names, (random.randint(1, 9), random.randint(1, 9)))
        else:
            out = step(jpegs)
        np.asarray(out.select(0).cpu())

    def loop(count: int, first: int) -> None:
        for index in range(first, first + count):
            one(index)

    random.seed(0)
    context = ndd_trace.enabled() if mode == "transparent" else None
    if context is not None:
        context.__enter__()
    loop(max(steps // 5, 8), 0)  # warm-up: the first variants, builds
    started = time.perf_counter()
    loop(steps, 1000)
    elapsed = time.perf_counter() - started
    if context is not None:
        context.__exit__(None, None, None)
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # program mode, in a child
    options = parser.parse_args()
    sys.path.insert(0, ROOT)
    from benchmarks._data import load_jpeg_bytes, make_jpeg_dir

    data = load_jpeg_bytes(make_jpeg_dir(os.path.join(tempfile.gettempdir(),
                                                      "ndd_trace_unsteady"), n=64))
    if options.one:
        seconds = _program(*options.one, options.device, options.steps, data)
        print(json.dumps({"seconds": seconds}))
        return
    results: dict = {}
    for program in options.programs.split(","):
        for mode in options.modes.split(","):
            completed = subprocess.run(
                [sys.executable, "-W", "ignore", __file__, "--device", options.device,
                 "--steps", str(options.steps), "--one", program, mode],
                capture_output=True, text=True, timeout=900)
            if completed.returncode:
                print(f"{program} {mode}: failed\n{completed.stderr[-2000:]}")
                continue
            seconds = json.loads(completed.stdout.strip().splitlines()[-1])["seconds"]
            results.setdefault(program, {})[mode] = 1 / seconds
    for program, rates in results.items():
        eager = rates.get("eager")
        cells = [f"{mode} {rate:8.1f} steps/s" + (f" ({rate / eager:.2f}x eager)" if eager else "")
                 for mode, rate in rates.items()]
        print(f"{program:15s} " + " | ".join(cells))
    if options.json:
        with open(options.json, "w") as file:
            json.dump({"device": options.device, "steps": options.steps, "rates": results}, file,
                      indent=1)


if __name__ == "__main__":
    main()
