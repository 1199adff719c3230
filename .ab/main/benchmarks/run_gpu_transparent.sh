#!/usr/bin/env bash
# GPU run for transparent mode's reader loops: the GPU tests, the transparent-mode and loop
# tests, then the decode workload (with and without a 2 ms training step) and small_ops in the
# modes that matter here (BENCH_ONLY=1: the benchmarks alone).
set -u
OUT=${OUT:-/tmp/ndd_trace_gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c 'import nvidia.dali as d, torch; print("DALI", d.__version__, "torch", torch.__version__)'
if [ -z "${BENCH_ONLY:-}" ]; then
    python3 -m pytest -q -rs -m gpu tests -p no:cacheprovider 2>&1 | tail -8 | tee "$OUT/gpu_tests.log"
    python3 -m pytest -q tests/test_streams.py tests/test_transparent.py \
        tests/test_loops.py -p no:cacheprovider 2>&1 | tail -4 | tee "$OUT/transparent_tests.log"
fi
for train in 0 2; do
    python3 benchmarks/bench_ops.py --device gpu --workloads decode_rrc_cmn --steps ${STEPS:-300} \
        --modes eager,capture,ndd_trace_loop,transparent,pipeline \
        --warmup 30 --threads 4 --train-ms $train --json "$OUT/bench_transparent_train$train.json" \
        2>&1 | tail -9 | tee "$OUT/bench_transparent_train$train.log"
done
python3 benchmarks/bench_ops.py --device gpu --workloads small_ops --steps ${STEPS:-300} \
    --modes eager,capture,ndd_trace,transparent,pipeline --warmup 30 --threads 4 \
    --json "$OUT/bench_transparent_small.json" 2>&1 | tail -9 | tee "$OUT/bench_transparent_small.log"
