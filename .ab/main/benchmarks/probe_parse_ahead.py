"""A program's first batch when it does other work between `@ndd.compile` and the first call
(building a model, as a training script does): eager ndd, the compiled step, and a
hand-written pipeline built after the same set-up, each in a fresh process. ndd_trace parses
the compiled function's module on a thread from its decoration (docs/warm-start.md); eager
ndd's first call parses it then. The step is `small_ops` of bench_ops.py (a 900-line module).

    python benchmarks/probe_parse_ahead.py --device cpu [--setup-s 1.5] [--rounds 2] [--tree .ab/old]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCHMARK_DIR = Path(__file__).resolve().parent
MODES = ("eager", "compiled", "pipeline")


def _one(mode: str, device: str, setup_s: float, tree: str) -> float:
    """Seconds from the end of the set-up to the first result on the host."""
    sys.path.insert(0, str(BENCHMARK_DIR))
    sys.path.insert(1, tree)  # (the ndd_trace measured)
    import numpy as np
    import nvidia.dali.experimental.dynamic as ndd
    import bench_ops

    if mode == "compiled":
        import ndd_trace  # noqa: F401

        step = ndd.compile(bench_ops.small_ops)
    else:
        step = bench_ops.small_ops
    import torch  # the user's set-up: a model trained for `setup_s` seconds on the CPU

    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(40)])
    inputs, started = torch.randn(64, 512), time.perf_counter()
    while time.perf_counter() - started < setup_s:
        model(inputs).sum().backward()
    images = [np.full((64, 64, 3), j, np.uint8) for j in range(8)]
    started = time.perf_counter()
    if mode == "pipeline":  # small_ops written by hand, built and run once
        options = argparse.Namespace(device=device, batch_size=8, threads=4, seed=42,
                                     hw_decoder_load=None)
        out = bench_ops.build_pipeline("small_ops", options, [images]).run()[0]
        out = out.as_cpu() if device == "gpu" else out
    else:
        batch = ndd.as_batch(images, layout="HWC", device=device)
        np.asarray(step(batch).torch().cpu())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--setup-s", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tree", default=str(BENCHMARK_DIR.parent),
                        help="the checkout whose ndd_trace is measured (default: this one)")
    parser.add_argument("--json")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        print(json.dumps(_one(options.one, options.device, options.setup_s, options.tree)))
        return
    seconds: dict = {mode: [] for mode in MODES}
    for _ in range(options.rounds):
        for mode in MODES:
            done = subprocess.run([sys.executable, "-W", "ignore", __file__, "--device",
                                   options.device, "--setup-s", str(options.setup_s),
                                   "--tree", options.tree, "--one", mode], capture_output=True, text=True, timeout=600)
            if done.returncode:
                print(f"{mode}: failed\n{done.stderr[-1500:]}")
                continue
            seconds[mode].append(float(done.stdout.strip().splitlines()[-1]))
    for mode, values in seconds.items():
        print(f"{mode:9s} first result after set-up: " + " / ".join(f"{v:.3f} s" for v in values))
    if options.json:
        with open(options.json, "w") as file:
            json.dump({"device": options.device, "setup_s": options.setup_s,
                       "seconds": seconds}, file, indent=1)


if __name__ == "__main__":
    main()
