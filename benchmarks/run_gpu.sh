#!/usr/bin/env bash
# What we run on the GPU machine (DALI unpacked by ../shared/tools/gpu-pack's unpack.sh first):
# the GPU tests, the whole suite, the main example on the GPU, and the benchmark on the GPU.
set -u
OUT=${OUT:-/tmp/ndd_trace_gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c 'import nvidia.dali as d, torch; print("DALI", d.__version__, "torch", torch.__version__)'
python3 -m pytest -q -rs -m gpu tests -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
python3 -m pytest -q tests -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/all_tests.log"
python3 examples/preprocess.py --device gpu 2>&1 | head -4 | tee "$OUT/example_gpu.log"
python3 benchmarks/bench_ops.py --device gpu --steps ${STEPS:-300} --warmup 30 --threads 4 \
    --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.log"
