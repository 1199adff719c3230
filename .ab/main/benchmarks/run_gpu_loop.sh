#!/usr/bin/env bash
# GPU run of the loop benchmark (issue: compiled loops): decode workload, all modes including a
# torchvision DataLoader, without and with a simulated 2 ms training step.
set -u
OUT=${OUT:-/tmp/ndd_trace_gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for train in 0 2; do
    python3 benchmarks/bench_ops.py --device gpu --workloads decode_rrc_cmn --steps ${STEPS:-300} \
        --warmup 30 --threads 4 --train-ms $train --json "$OUT/bench_loop_train$train.json" 2>&1 \
        | tee "$OUT/bench_loop_train$train.log"
done
