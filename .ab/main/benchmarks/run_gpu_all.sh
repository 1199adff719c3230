#!/usr/bin/env bash
# Every benchmark mode side by side on the GPU, each in a fresh process (~5-8 minutes on an
# H200): small_ops (batch 8; the hand-built per-call pipeline included), the decode workload
# (batch 16; the compiled step in an eager reader loop = `ndd_trace`), and the "train" decode
# workload (batch 256, 16 threads, 4096 JPEGs; ROUNDS rounds, 3 by default, the table takes
# each mode's median). Writes JSON per workload (and round) under $OUT, prints each table and
# then the ratios to the hand-written pipeline for all of them. Make the chart elsewhere
# (matplotlib): python benchmarks/chart.py $OUT/bench_*.json
#
#     OUT=/tmp/out bash benchmarks/run_gpu_all.sh   # STEPS=300 by default; BENCH_ONLY=1: no tests
#
# PARTS picks workloads (default "small decode train"); DECODE_ROUNDS (default 1) runs the
# decode workload in rounds too (bench_decode_rN.json).
set -u
OUT=${OUT:-/tmp/ndd_trace_gpu_out}
STEPS=${STEPS:-300}
ROUNDS=${ROUNDS:-3}
DECODE_ROUNDS=${DECODE_ROUNDS:-1}
PARTS=${PARTS:-small decode train}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c 'import nvidia.dali as d, torch; print("DALI", d.__version__, "torch", torch.__version__)'
if [ -z "${BENCH_ONLY:-}" ]; then  # the new differential tests first (~20 s)
    python3 -m pytest -q tests/test_streams.py -p no:cacheprovider 2>&1 | tail -3 \
        | tee "$OUT/compiled_readers_tests.log"
fi
case " $PARTS " in *" small "*)
python3 benchmarks/bench_ops.py --device gpu --workloads small_ops --steps "$STEPS" --warmup 30 \
    --threads 4 --modes eager,capture,ndd_trace,ndd_trace_fed,transparent,pipeline_percall,pipeline \
    --json "$OUT/bench_small_ops.json" 2>&1 | tail -10 | tee "$OUT/bench_small_ops.log"
esac
case " $PARTS " in *" decode "*)
for round in $(seq 1 "$DECODE_ROUNDS"); do
    suffix=$([ "$DECODE_ROUNDS" = 1 ] && echo "" || echo "_r$round")
    python3 benchmarks/bench_ops.py --device gpu --workloads decode_rrc_cmn --steps "$STEPS" \
        --warmup 30 --threads 4 \
        --modes eager,capture,ndd_trace,ndd_trace_loop,ndd_trace_checked,ndd_trace_optimize,transparent,pipeline,pipeline_fused,decode_only \
        --json "$OUT/bench_decode$suffix.json" 2>&1 | tail -13 | tee "$OUT/bench_decode$suffix.log"
done
esac
case " $PARTS " in *" train "*) ;; *) ROUNDS=0 ;; esac
for round in $(seq 1 "$ROUNDS"); do
    python3 benchmarks/bench_ops.py --device gpu --workloads decode_rrc_cmn --steps 100 \
        --warmup 40 --threads 16 --batch-size 256 --images 4096 \
        --modes eager,capture,ndd_trace,ndd_trace_loop,ndd_trace_checked,ndd_trace_optimize,transparent,pipeline,pipeline_fused,decode_only \
        --json "$OUT/bench_train_r$round.json" 2>&1 | tail -14 | tee "$OUT/bench_train_r$round.log"
done
echo
echo "ratios to the hand-written pipeline (steps/s):"
python3 benchmarks/chart.py --table $(ls "$OUT"/bench_*.json) 2>&1 | tee "$OUT/ratios.md"
