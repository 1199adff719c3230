#!/usr/bin/env bash
# What we run on the GPU machine (DALI unpacked by ../shared/tools/gpu-pack's unpack.sh first):
# the GPU tests, the whole suite, the examples on the GPU (DDP on 2 GPUs where there are two),
# and the benchmark on the GPU.
set -u
OUT=${OUT:-/tmp/ndd_trace_gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c 'import nvidia.dali as d, torch; print("DALI", d.__version__, "torch", torch.__version__)'
python3 -m pytest -q -rs -m gpu tests -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
python3 -m pytest -q tests -p no:cacheprovider 2>&1 \
    | tail -5 | tee "$OUT/all_tests.log"
python3 examples/preprocess.py --device gpu 2>&1 | head -4 | tee "$OUT/example_gpu.log"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    torchrun --nproc_per_node=2 examples/ddp_train.py --device gpu --epochs 2 2>&1 \
        | grep -v "^W" | tail -5 | tee "$OUT/ddp_gpu.log"
fi
python3 benchmarks/bench_ops.py --device gpu --steps ${STEPS:-300} --warmup 30 --threads 4 \
    --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.log"
