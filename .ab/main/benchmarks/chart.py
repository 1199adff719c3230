"""Chart the ratios of every mode to the hand-written pipeline, from bench_ops JSON files.

    python benchmarks/chart.py --results benchmarks/RESULTS.md              # -> ratios.png
    python benchmarks/chart.py out/bench_small.json out/bench_decode.json   # a run's own chart
    python benchmarks/chart.py --output /tmp/ratios.png --title "H200" results/*.json
    python benchmarks/chart.py --scaling out/scaling_t*_b*.json                 # -> scaling.png

With --results: the chart of the docs (benchmarks/ratios.png), drawn from the current figures'
table at the top of RESULTS.md, one group per column whose cells are single ratios, one bar per
row. The PNG keeps the table's digest (`table_digest`) under "Source", so a test can tell a chart
drawn from another table (tests/test_docs.py).

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
import hashlib
import json
import re
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


CURRENT_START = "<!-- --8<-- [start:current] -->"
CURRENT_END = "<!-- --8<-- [end:current] -->"
SOURCE_KEY = "Source"  # the PNG text chunk holding the table's digest
RESULTS_TITLE = ("ndd_trace: steps/s relative to a hand-written @pipeline_def "
                 "(benchmarks/RESULTS.md, current figures)")


def current_table(results_path: str) -> tuple[list[str], list[list[str]]]:
    """The current figures' table of RESULTS.md: its column headers and its rows (each a mode's
    label, then one cell per column)."""
    text = Path(results_path).read_text()
    if CURRENT_START not in text or CURRENT_END not in text:
        raise ValueError(f"{results_path}: no current figures between {CURRENT_START!r} and "
                         f"{CURRENT_END!r}")
    section = text[text.index(CURRENT_START):text.index(CURRENT_END)]
    lines = [line.strip() for line in section.splitlines() if line.strip().startswith("|")]
    if len(lines) < 3:
        raise ValueError(f"{results_path}: the current figures hold no table")
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    header, rows = cells[0], cells[2:]  # cells[1]: the |---| line
    return header[1:], rows


def table_digest(results_path: str) -> str:
    """sha256 of the current figures' table: its lines, stripped, one per row."""
    header, rows = current_table(results_path)
    text = "\n".join(["|".join(header)] + ["|".join(row) for row in rows])
    return hashlib.sha256(text.encode()).hexdigest()


_RATIO = re.compile(r"\d+\.\d+")


def results_groups(results_path: str) -> tuple[dict[str, dict[str, float]], list[str]]:
    """{column: {mode: ratio}} of the columns whose cells are single ratios (or `-`), and the
    modes in the table's order."""
    header, rows = current_table(results_path)
    groups: dict[str, dict[str, float]] = {}
    for index, column in enumerate(header):
        cells = {row[0]: row[1 + index] for row in rows}
        if all(cell == "-" or _RATIO.fullmatch(cell) for cell in cells.values()):
            groups[column] = {mode: float(cell) for mode, cell in cells.items() if cell != "-"}
    return groups, [row[0] for row in rows]


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


def bar_chart(ratios: dict[str, dict[str, float]], modes: list[str], labels: dict[str, str],
              colours: dict[str, int], output: str, title: str,
              metadata: dict[str, str] | None = None) -> None:
    """One group of bars per key of `ratios`, one bar per mode in `modes`' order (`colours`:
    each mode's colour in tab20, the same in every chart), the pipeline's 1.0 dashed."""
    plt = _pyplot()
    width = 0.8 / len(modes)
    figure, axes = plt.subplots(figsize=(max(7.0, 2.2 * len(ratios) + 2), 5.2))
    for index, mode in enumerate(modes):
        xs = [group + (index - (len(modes) - 1) / 2) * width for group in range(len(ratios))]
        heights = [r.get(mode, 0.0) for r in ratios.values()]
        bars = axes.bar(xs, heights, width, label=labels[mode],
                        color=plt.cm.tab20(colours[mode] % 20))
        for bar, height in zip(bars, heights):
            if height:
                axes.annotate(f"{height:.2f}", (bar.get_x() + bar.get_width() / 2, height),
                              ha="center", va="bottom", fontsize=7, rotation=90,
                              xytext=(0, 2), textcoords="offset points")
    axes.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axes.set_xticks(range(len(ratios)), list(ratios), fontsize=8)
    axes.set_ylabel("steps/s relative to @pipeline_def")
    axes.set_title(title, fontsize=10)
    top = max(max(r.values()) for r in ratios.values())
    axes.set_ylim(0, max(1.15, top * 1.15))
    axes.legend(fontsize=7, ncols=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    figure.tight_layout()
    # the legend below the axes; metadata: PNG text chunks (the table's digest)
    figure.savefig(output, dpi=120, bbox_inches="tight", metadata=metadata)
    print(f"chart written to {output}")


def results_chart(results_path: str, output: str, title: str) -> int:
    groups, modes = results_groups(results_path)
    if not groups:
        print(f"chart: no column of single ratios in {results_path}", file=sys.stderr)
        return 1
    shown = [mode for mode in modes if any(mode in group for group in groups.values())]
    # "train b256, H200, s13" -> "train b256\nH200, s13": the column's workload over its run
    ratios = {column.replace(", ", "\n", 1): group for column, group in groups.items()}
    bar_chart(ratios, shown, {mode: mode.replace("`", "") for mode in shown},
              {mode: modes.index(mode) for mode in shown}, output, title,
              metadata={SOURCE_KEY: table_digest(results_path)})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="*", help="bench_ops.py --json outputs")
    parser.add_argument("--output", default=str(Path(__file__).with_name("ratios.png")))
    parser.add_argument("--title", default="ndd_trace: speed relative to a hand-written pipeline")
    parser.add_argument("--table", action="store_true",
                        help="print the ratios as a markdown table only (no matplotlib needed)")
    parser.add_argument("--results", metavar="RESULTS.md",
                        help="draw the current figures' table of this file (the docs' chart)")
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
    if options.results:
        title = options.title
        if title == parser.get_default("title"):
            title = RESULTS_TITLE
        return results_chart(options.results, options.output, title)
    if not options.json:
        parser.error("give bench_ops.py --json files, or --results RESULTS.md")
    if options.table:
        print_table(load_groups(options.json))
        return 0
    ratios = load_groups(options.json)
    if not ratios:
        print("chart: no group with a `pipeline` result", file=sys.stderr)
        return 1
    modes = [mode for mode in MODE_ORDER if any(mode in r for r in ratios.values())]
    bar_chart(ratios, modes, {mode: LABELS.get(mode, mode) for mode in modes},
              {mode: MODE_ORDER.index(mode) for mode in modes}, options.output, options.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
