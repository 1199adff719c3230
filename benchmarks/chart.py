"""Chart the ratios of every mode to the hand-written pipeline, from bench_ops JSON files.

    python benchmarks/chart.py out/bench_small.json out/bench_decode.json   # -> ratios.png
    python benchmarks/chart.py --output /tmp/ratios.png --title "H200" results/*.json
    python benchmarks/chart.py --scaling out/scaling_t*_b*.json                 # -> scaling.png

One group of bars per (workload, batch size, device, training step) found in the files, one
bar per mode, height = steps/s divided by the `pipeline` mode's steps/s of the same group (1.0
is the hand-written, prefetching `@pipeline_def`). A mode measured in several files (rounds of
the same benchmark) counts with the median of its rates. Needs matplotlib (`pip install .[bench]`).

With --scaling: samples/s against batch size, one line per mode and one panel per thread count,
from runs of one workload at several batch sizes and thread counts (run_gpu_session.sh's
`scaling` part).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

MODE_ORDER = ("eager", "capture", "ndd_trace", "ndd_trace_fed", "ndd_trace_loop",
              "ndd_trace_checked", "ndd_trace_optimize",
              "transparent", "pipeline_percall", "pipeline", "pipeline_fused", "decode_only",
              "fused_decode_only", "dataloader")
LABELS = {
    "eager": "eager ndd",
    "capture": "DALI capture mode",
    "ndd_trace": "@ndd.compile step (per call)",
    "ndd_trace_fed": "@ndd.compile step fed ready-made batches",
    "ndd_trace_loop": "compiled generator",
    "ndd_trace_checked": "compiled generator, checked mode",
    "ndd_trace_optimize": "compiled generator, optimize=True",
    "transparent": "transparent mode",
    "pipeline_percall": "hand-built per-call pipeline",
    "pipeline": "@pipeline_def",
    "pipeline_fused": "@pipeline_def, fused by hand",
    "decode_only": "reader + decoder alone (ceiling)",
    "fused_decode_only": "reader + ROI decoder alone (ceiling of exact fusion)",
    "dataloader": "torch DataLoader",
}


def load_groups(paths: list[str]) -> dict[str, dict[str, float]]:
    """{group label: {mode: ratio to pipeline}} from bench_ops JSON files."""
    groups: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        report = json.loads(Path(path).read_text())
        train_ms = report.get("config", {}).get("train_ms", 0) or 0
        for result in report["results"]:
            if result["status"] != "ok":
                continue
            label = (f"{result['workload']}\nbatch {result['batch_size']}, {result['device']}"
                     + (f", {train_ms:g} ms step" if train_ms else ""))
            groups.setdefault(label, {}).setdefault(result["mode"], []).append(
                result["steps_per_s"])
    ratios = {}
    for label, runs in groups.items():
        rates = {mode: statistics.median(values) for mode, values in runs.items()}
        base = rates.get("pipeline")
        if base:
            ratios[label] = {mode: rate / base for mode, rate in rates.items()}
    return ratios


def print_table(ratios: dict[str, dict[str, float]]) -> None:
    """The ratios to the hand-written pipeline as a markdown table, one row per group."""
    modes = [mode for mode in MODE_ORDER if any(mode in r for r in ratios.values())]
    print("| workload | " + " | ".join(modes) + " |")
    print("|---" * (len(modes) + 1) + "|")
    for label, row in ratios.items():
        cells = [f"{row[mode]:.2f}x" if mode in row else "-" for mode in modes]
        print(f"| {label.replace(chr(10), ', ')} | " + " | ".join(cells) + " |")


def load_scaling(paths: list[str]) -> dict[int, dict[str, dict[int, float]]]:
    """threads -> mode -> batch size -> samples/s (the median over files of the same point)."""
    points: dict[int, dict[str, dict[int, list[float]]]] = {}
    for path in paths:
        with open(path) as file:
            data = json.load(file)
        threads = int(data["config"]["threads"])
        for result in data["results"]:
            if result.get("status") != "ok" or not result.get("samples_per_s"):
                continue
            by_batch = points.setdefault(threads, {}).setdefault(result["mode"], {})
            by_batch.setdefault(int(result["batch_size"]), []).append(result["samples_per_s"])
    return {threads: {mode: {batch: statistics.median(rates)
                             for batch, rates in sorted(batches.items())}
                      for mode, batches in modes.items()}
            for threads, modes in sorted(points.items())}


def _pyplot():
    """matplotlib's pyplot, drawing to files (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scaling_chart(paths: list[str], output: str, title: str) -> int:
    plt = _pyplot()
    curves = load_scaling(paths)
    if not curves:
        print("chart: no scaling results", file=sys.stderr)
        return 1
    figure, panels = plt.subplots(1, len(curves), figsize=(5.2 * len(curves), 4.4), sharey=True,
                                  squeeze=False)
    for axes, (threads, modes) in zip(panels[0], curves.items()):
        for mode in [m for m in MODE_ORDER if m in modes]:
            batches = list(modes[mode])
            axes.plot(batches, [modes[mode][b] for b in batches], marker="o",
                      label=LABELS.get(mode, mode))
        axes.set_xscale("log", base=2)
        sizes = sorted({batch for batches in modes.values() for batch in batches})
        axes.set_xticks(sizes, [str(size) for size in sizes])
        axes.set_xlabel("batch size")
        axes.set_title(f"{threads} threads", fontsize=9)
        axes.grid(alpha=0.3)
    panels[0][0].set_ylabel("samples/s")
    panels[0][0].legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    print(f"chart written to {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="bench_ops.py --json outputs")
    parser.add_argument("--output", default=str(Path(__file__).with_name("ratios.png")))
    parser.add_argument("--title", default="ndd_trace: speed relative to a hand-written pipeline")
    parser.add_argument("--table", action="store_true",
                        help="print the ratios as a markdown table only (no matplotlib needed)")
    parser.add_argument("--scaling", action="store_true",
                        help="samples/s against batch size and threads (default output "
                             "scaling.png)")
    options = parser.parse_args(argv)
    if options.scaling:
        output = options.output
        if output == str(Path(__file__).with_name("ratios.png")):
            output = str(Path(__file__).with_name("scaling.png"))
        title = options.title
        if title == parser.get_default("title"):
            title = "ndd_trace: throughput against batch size and threads"
        return scaling_chart(options.json, output, title)
    if options.table:
        print_table(load_groups(options.json))
        return 0
    plt = _pyplot()
    ratios = load_groups(options.json)
    if not ratios:
        print("chart: no group with a `pipeline` result", file=sys.stderr)
        return 1
    modes = [mode for mode in MODE_ORDER if any(mode in r for r in ratios.values())]
    width = 0.8 / len(modes)
    figure, axes = plt.subplots(figsize=(max(7.0, 2.2 * len(ratios) + 2), 5.2))
    for index, mode in enumerate(modes):
        xs = [group + (index - (len(modes) - 1) / 2) * width for group in range(len(ratios))]
        heights = [r.get(mode, 0.0) for r in ratios.values()]
        bars = axes.bar(xs, heights, width, label=LABELS.get(mode, mode),
                        color=plt.cm.tab20(MODE_ORDER.index(mode) % 20))  # a colour per mode
        for bar, height in zip(bars, heights):
            if height:
                axes.annotate(f"{height:.2f}", (bar.get_x() + bar.get_width() / 2, height),
                              ha="center", va="bottom", fontsize=7, rotation=90,
                              xytext=(0, 2), textcoords="offset points")
    axes.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axes.set_xticks(range(len(ratios)), list(ratios), fontsize=8)
    axes.set_ylabel("steps/s relative to @pipeline_def")
    axes.set_title(options.title, fontsize=10)
    top = max(max(r.values()) for r in ratios.values())
    axes.set_ylim(0, max(1.15, top * 1.15))
    axes.legend(fontsize=7, ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    figure.tight_layout()
    figure.savefig(options.output, dpi=120, bbox_inches="tight")  # the legend below the axes
    print(f"chart written to {options.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
