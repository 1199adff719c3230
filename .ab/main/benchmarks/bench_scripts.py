"""Time the script corpus plainly, through `python -m ndd_trace`, and under capture mode.

    python benchmarks/bench_scripts.py --repeat 3 --steps 200

Whole-process wall time for every script in tests/scripts (best of --repeat), and for the
scripts that time their own loop (small_ops: NDD_STEPS steps; decode_loop, a reader loop with a
model step: --steps / 4 epochs of 4 steps) their loop rate plainly, under capture mode and
through `python -m ndd_trace`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
CORPUS = ["classify", "detection_boxes", "external_numpy", "audio_1d", "data_dependent",
          "early_break", "warmup", "small_ops", "decode_loop"]


def run(arguments: list[str], env: dict) -> tuple[float, str, str]:
    start = time.perf_counter()
    completed = subprocess.run([sys.executable, *arguments], cwd=SCRIPTS, env=env,
                               capture_output=True, text=True, timeout=900)
    return time.perf_counter() - start, completed.stdout, completed.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    options = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": ROOT, "NDD_TRACE_DATA": tempfile.gettempdir(),
           "NDD_STEPS": str(options.steps)}
    print(f"{'script':<18} {'plain s':>8} {'ndd_trace s':>12} {'ratio':>6}  same output")
    for name in CORPUS:
        plain = min(run([f"{name}.py"], env)[0] for _ in range(options.repeat))
        traced = min(run(["-m", "ndd_trace", f"{name}.py"], env)[0]
                     for _ in range(options.repeat))
        same = run([f"{name}.py"], env)[1] == run(["-m", "ndd_trace", f"{name}.py"], env)[1]
        print(f"{name:<18} {plain:8.2f} {traced:12.2f} {plain / traced:5.2f}x  {same}")

    def loop_rate(arguments: list[str], extra: dict) -> float:
        rates = []
        for _ in range(options.repeat):
            _, _, stderr = run(arguments, {**env, **extra})
            rates.append(float(re.search(r"([\d.]+) steps/s", stderr).group(1)))
        return max(rates)

    # the scripts that time their own loop, and can run it under capture mode (NDD_CAPTURE=1)
    loops = {"small_ops": {"NDD_STEPS": str(options.steps)},
             "decode_loop": {"NDD_EPOCHS": str(max(1, options.steps // 4))}}
    print(f"\nloop rates (steps/s, best of {options.repeat}):")
    print(f"{'script':<14} {'plain':>8} {'capture':>8} {'ndd_trace':>10}  vs plain  vs capture")
    for name, extra in loops.items():
        plain = loop_rate([f"{name}.py"], extra)
        capture = loop_rate([f"{name}.py"], {**extra, "NDD_CAPTURE": "1"})
        traced = loop_rate(["-m", "ndd_trace", f"{name}.py"], extra)
        print(f"{name:<14} {plain:8.1f} {capture:8.1f} {traced:10.1f}  {traced / plain:7.2f}x "
              f"{traced / capture:9.2f}x")

if __name__ == "__main__":
    main()
