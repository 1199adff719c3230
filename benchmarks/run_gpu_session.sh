#!/usr/bin/env bash
# One GPU lease, in a few full calls: PARTS picks what a call runs (each writes under $OUT).
#
#     OUT=$OUT PARTS="gputests small" bash benchmarks/run_gpu_session.sh
#     OUT=$OUT PARTS="train ddp" ROUNDS=2 bash benchmarks/run_gpu_session.sh
#     OUT=$OUT PARTS="ab scaling" OLD=.ab/old bash benchmarks/run_gpu_session.sh
#
# gputests: the GPU tests (pytest -m gpu)
# conformance: DALI's own tests in $DALI_TESTS (benchmarks/dali_conformance.py), plain and under
#          transparent mode
# tests:   the whole suite on 8 workers (pytest-xdist), at most TESTS_S seconds (default 420)
# Wheels in .whl/ (carried: torchdata, which that machine lacks) are installed first.
# small:   the small workload (small_ops, batch 8), every mode
# tiny:    issue 34's tiny workload (32x32 images, batch 8, 13 ops capture mode takes whole): the
#          compiled step against the per-call pipeline, the compiled generator against the
#          pipeline, transparent mode against capture mode and eager
# decode:  the decode workload (batch 16), every mode
# train:   the train workload (batch TRAIN_BATCH, default 256, 16 threads, 4096 JPEGs), ROUNDS rounds, every mode,
#          TRAIN_STEPS timed steps (default 100)
# ddp:     benchmarks/bench_ddp.py on the GPUs there are (torchrun, one pipeline per rank)
# ab:      the train workload for the compiled generator, transparent mode and the pipeline,
#          this tree against the one in $OLD (an older checkout's ndd_trace/ and benchmarks/),
#          alternating, ROUNDS rounds each
# absmall: the small workload (small_ops, batch 8) for the compiled step, transparent mode and the
#          pipeline, this tree against the one in $OLD, alternating, ROUNDS rounds each
# batches: the train workload at each batch size of BATCHES (default 16 32 64 128 256), every exact
#          way (BATCH_MODES, default the compiled step, the compiled generator, transparent mode)
#          beside capture mode and the pipeline, 16 threads, BATCH_STEPS steps (default 100):
#          issue 34's per-step cost, and benchmarks/chart.py --scaling (batches.png)
# scaling: throughput against batch size (SCALING_BATCHES, default 32 64 256 512) and threads (4,
#          16) for the pipeline, capture mode, the compiled generator and optimize, SCALING_STEPS
#          steps (default 200) after a quarter as many (benchmarks/chart.py --scaling)
#
# At the end, everything under $OUT is packed into $OUT/session.tgz (the device tool returns at
# most 8 files): unpack it with `tar xzf session.tgz`. Keep a log of your own outside $OUT (or
# copy it in after the script): what is under $OUT when the script ends goes into the archive.
# sweep:   the train workload's pipeline fused by hand, the decoder alone and optimize, over
#          threads (SWEEP_THREADS, default 4 8 16) and hw_decoder_load (SWEEP_LOADS, default
#          0.5 0.65 0.9 1.0), and the obvious pipeline at each thread count: the landscape a
#          per-machine tuner searches
# tune:    per-machine tuning (optimize=True, docs/optimize.md): the train workload's optimize
#          mode run TUNE_STEPS steps (default 6000: the search waits 20 s) with an empty cache directory, which it
#          tunes from and keeps its settings in (copied here: each measurement is listed);
#          then ROUNDS rounds of the train workload, every mode, with that cache directory
#          (optimize starts tuned; the other ndd_trace modes get the warm start)
# warm:    the warm start (NDD_TRACE_CACHE_DIR, docs/warm-start.md): the train workload's first
#          batch for the compiled generator, the compiled step and transparent mode, each in a
#          process with an empty cache (cold) and then one with the cache it left (warm), and the
#          pipeline's beside them, ROUNDS rounds
# optshort: optimize beside the pipeline, OPTSHORT_STEPS steps (default 400) with an empty cache
#          directory: a run too short to search (tuning.SEARCH_AFTER_S) runs on the start's settings
# abunsteady: bench_unsteady.py (programs whose steps do not repeat) in each tree of AB_TREES
#          ("name=root ...", default "new=. old=$OLD"; ab and absmall too), UNSTEADY_STEPS steps
# abtiny:  the tiny workload (ABTINY_MODES, default the compiled step, transparent mode, capture
#          mode, the per-call pipeline) in each tree of AB_TREES, ROUNDS rounds
# coalesce: probe_coalesce.py on the GPU (issue 34's coalescing ceiling on the tiny loop, and
#          whether its exact ways are eager's bit for bit), COALESCE_KS (default 1 2 4 8 16); and
#          the train workload's at batch 32, COALESCE_TRAIN_KS (default 1 2 4 8)
# coalesced: the train workload with NDD_TRACE_COALESCE=K for K in COALESCED_KS (default 0 4 8;
#          0: off) at each batch of COALESCED_BATCHES (default 32), ndd_trace's ways beside the
#          pipeline
# readerstep: probe_reader_step.py (a compiled step over a File reader: ms a step split into
#          source, call and consume, and how its calls ran) at READERSTEP_BATCHES (16 32 64),
#          each with NDD_TRACE_COALESCE of READERSTEP_KS (0 4)
# parseahead: probe_parse_ahead.py (the first result after 1.5 s of other set-up: eager, the
#          compiled step, the pipeline) with each tree of AB_TREES's ndd_trace, ROUNDS rounds
set -u
OUT=${OUT:-/tmp/ndd_trace_gpu_out}
ROUNDS=${ROUNDS:-2}
PARTS=${PARTS:-tests small train}
OLD=${OLD:-.ab/old}
AB_TREES=${AB_TREES:-new=. old=$OLD}  # the trees an A/B part runs, "name=root" each, in order
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ALL=eager,capture,ndd_trace,ndd_trace_loop,ndd_trace_checked,ndd_trace_optimize,transparent,pipeline,pipeline_fused,decode_only,fused_decode_only
TRAIN="--device gpu --workloads decode_rrc_cmn --steps 100 --warmup 40 --threads 16 --batch-size ${TRAIN_BATCH:-256} --images 4096"
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
# every command ends by DEADLINE_S seconds into the script (default 560, under the device tool's
# 600 s a call), so that the archive below is always written
DEADLINE=${DEADLINE_S:-560}
bounded() {
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -le 5 ]; then echo "skipped (past DEADLINE_S): $*"; return 124; fi
    timeout "$left" "$@"
}
nvidia-smi -L
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
python3 -c 'import nvidia.dali as d, torch; print("DALI", d.__version__, "torch", torch.__version__)'
if has gputests; then
    bounded python3 -m pytest -q -rs -m gpu tests -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
fi
if has conformance; then  # DALI's own tests in $DALI_TESTS, plain and under transparent mode
    bounded python3 benchmarks/dali_conformance.py "$DALI_TESTS" --json "$OUT/conformance.json" 2>&1 \
        | tail -20 | tee "$OUT/conformance.log"
fi
if has tests; then
    bounded timeout "${TESTS_S:-420}" python3 -m pytest -q -n 8 tests -p no:cacheprovider \
        --deselect tests/test_repros.py 2>&1 | tail -25 | tee "$OUT/all_tests.log"
fi
if has small; then
    bounded python3 benchmarks/bench_ops.py --device gpu --workloads small_ops --steps 300 --warmup 30 \
        --threads 4 --modes eager,capture,ndd_trace,ndd_trace_fed,transparent,pipeline_percall,pipeline \
        --json "$OUT/bench_small_ops.json" 2>&1 | tail -12 | tee "$OUT/bench_small_ops.log"
fi
if has tiny; then
    bounded python3 benchmarks/bench_ops.py --device gpu --workloads tiny --steps 600 --warmup 60 \
        --threads 4 --modes eager,capture,ndd_trace,ndd_trace_loop,transparent,pipeline_percall,pipeline \
        --json "$OUT/bench_tiny.json" 2>&1 | tail -12 | tee "$OUT/bench_tiny.log"
fi
if has decode; then
    bounded python3 benchmarks/bench_ops.py --device gpu --workloads decode_rrc_cmn --steps 300 --warmup 30 \
        --threads 4 --modes "$ALL" --json "$OUT/bench_decode.json" 2>&1 | tail -14 \
        | tee "$OUT/bench_decode.log"
fi
if has train; then
    for round in $(seq 1 "$ROUNDS"); do
        bounded python3 benchmarks/bench_ops.py $TRAIN ${TRAIN_STEPS:+--steps $TRAIN_STEPS} --modes "$ALL" \
            --json "$OUT/bench_train_r$round.json" \
            2>&1 | tail -16 | tee "$OUT/bench_train_r$round.log"
    done
fi
if has ddp; then
    bounded python3 benchmarks/bench_ddp.py --json "$OUT/bench_ddp.json" 2>&1 | tail -14 | tee "$OUT/bench_ddp.log"
fi
if has ab; then
    for round in $(seq 1 "$ROUNDS"); do
        for tree in $AB_TREES; do
            root=$PWD/${tree#*=}  # its ndd_trace/ first on the path, for every mode's process
            (cd / && PYTHONPATH=$root:$PYTHONPATH python3 -c 'import ndd_trace; print("ndd_trace from", ndd_trace.__file__)')
            PYTHONPATH=$root:$PYTHONPATH bounded python3 "$root/benchmarks/bench_ops.py" $TRAIN \
                --modes "${AB_MODES:-ndd_trace,ndd_trace_loop,transparent,pipeline}" \
                --json "$OUT/ab_${tree%%=*}_r$round.json" 2>&1 | tail -6 | tee "$OUT/ab_${tree%%=*}_r$round.log"
        done
    done
fi
if has absmall; then
    for round in $(seq 1 "$ROUNDS"); do
        for tree in $AB_TREES; do
            root=$PWD/${tree#*=}
            (cd / && PYTHONPATH=$root:$PYTHONPATH python3 -c 'import ndd_trace; print("ndd_trace from", ndd_trace.__file__)')
            PYTHONPATH=$root:$PYTHONPATH bounded python3 "$root/benchmarks/bench_ops.py" --device gpu \
                --workloads small_ops --steps 300 --warmup 30 --threads 4 \
                --modes ndd_trace,transparent,pipeline --json "$OUT/absmall_${tree%%=*}_r$round.json" \
                2>&1 | tail -6 | tee "$OUT/absmall_${tree%%=*}_r$round.log"
        done
    done
fi
if has abtiny; then
    for round in $(seq 1 "$ROUNDS"); do
        for tree in $AB_TREES; do
            root=$PWD/${tree#*=}
            PYTHONPATH=$root:$PYTHONPATH bounded python3 "$root/benchmarks/bench_ops.py" --device gpu \
                --workloads tiny --steps 600 --warmup 60 --threads 4 \
                --modes "${ABTINY_MODES:-ndd_trace,transparent,capture,pipeline_percall}" \
                --json "$OUT/abtiny_${tree%%=*}_r$round.json" \
                2>&1 | tail -7 | tee "$OUT/abtiny_${tree%%=*}_r$round.log"
        done
    done
fi
if has coalesce; then
    bounded python3 benchmarks/probe_coalesce.py --device gpu --ks ${COALESCE_KS:-1 2 4 8 16} \
        2>&1 | tail -25 | tee "$OUT/coalesce.log"
    bounded python3 benchmarks/probe_coalesce.py --device gpu --workload train --batch-size 32 \
        --threads 16 --steps 400 --ks ${COALESCE_TRAIN_KS:-1 2 4 8} 2>&1 | tail -12 \
        | tee "$OUT/coalesce_train.log"
fi
if has coalesced; then  # ndd_trace with NDD_TRACE_COALESCE=K (0: off) beside the pipeline
    for batch in ${COALESCED_BATCHES:-32}; do
        for k in ${COALESCED_KS:-0 4 8}; do
            NDD_TRACE_COALESCE=$k bounded python3 benchmarks/bench_ops.py --device gpu \
                --workloads decode_rrc_cmn --steps "${BATCH_STEPS:-200}" --warmup 30 --threads 16 \
                --batch-size "$batch" --images 4096 \
                --modes "${COALESCED_MODES:-ndd_trace_loop,ndd_trace,transparent,pipeline}" \
                --json "$OUT/coalesced_b${batch}_k$k.json" 2>&1 | tail -7 \
                | tee "$OUT/coalesced_b${batch}_k$k.log"
        done
    done
fi
if has readerstep; then  # probe_reader_step.py: the step's split and its runs ahead, per batch
    for batch in ${READERSTEP_BATCHES:-16 32 64}; do
        for k in ${READERSTEP_KS:-0 4}; do
            NDD_TRACE_COALESCE=$k bounded python3 benchmarks/probe_reader_step.py --device gpu \
                --batch-size "$batch" --steps 400 2>&1 | tail -1 | tee -a "$OUT/readerstep.log"
        done
    done
fi
if has batches; then
    for batch in ${BATCHES:-16 32 64 128 256}; do
        bounded python3 benchmarks/bench_ops.py --device gpu --workloads decode_rrc_cmn \
            --steps "${BATCH_STEPS:-100}" --warmup 30 --threads 16 --batch-size "$batch" --images 4096 \
            --modes "${BATCH_MODES:-ndd_trace,ndd_trace_loop,transparent,capture,pipeline}" \
            --json "$OUT/batches_b$batch.json" 2>&1 | tail -8 | tee "$OUT/batches_b$batch.log"
    done
fi
if has scaling; then
    for threads in 4 16; do
        for batch in ${SCALING_BATCHES:-32 64 256 512}; do
            steps=${SCALING_STEPS:-200}
            bounded python3 benchmarks/bench_ops.py --device gpu --workloads decode_rrc_cmn --steps "$steps" \
                --warmup $((steps / 4)) --threads "$threads" --batch-size "$batch" --images 4096 \
                --modes capture,ndd_trace_loop,ndd_trace_optimize,pipeline \
                --json "$OUT/scaling_t${threads}_b$batch.json" 2>&1 | tail -7 \
                | tee "$OUT/scaling_t${threads}_b$batch.log"
        done
    done
fi
if has sweep; then
    for threads in ${SWEEP_THREADS:-4 8 16}; do
        bounded python3 benchmarks/bench_ops.py $TRAIN --steps 200 --threads "$threads" --modes pipeline \
            --json "$OUT/sweep_t${threads}_pipeline.json" 2>&1 | tail -4 \
            | tee "$OUT/sweep_t${threads}_pipeline.log"
        for load in ${SWEEP_LOADS:-0.5 0.65 0.9 1.0}; do
            bounded python3 benchmarks/bench_ops.py $TRAIN --steps 200 --threads "$threads" \
                --hw-decoder-load "$load" --modes pipeline_fused,decode_only,ndd_trace_optimize \
                --json "$OUT/sweep_t${threads}_l$load.json" 2>&1 | tail -6 \
                | tee "$OUT/sweep_t${threads}_l$load.log"
        done
    done
fi
if has tune; then
    cache=${TUNE_CACHE:-/tmp/ndd-tune}  # kept between calls of one lease
    mkdir -p "$cache"
    NDD_TRACE_CACHE_DIR=$cache bounded python3 benchmarks/bench_ops.py \
        $TRAIN --steps "${TUNE_STEPS:-6000}" --modes ndd_trace_optimize,pipeline \
        --json "$OUT/tune_first_run.json" 2>&1 | grep -v "^\s*$" | tail -40 \
        | tee "$OUT/tune_first_run.log"
    cp "$cache"/tuning-*.json "$OUT/" 2>/dev/null
    for round in $(seq 1 "$ROUNDS"); do
        NDD_TRACE_CACHE_DIR=$cache bounded python3 benchmarks/bench_ops.py $TRAIN --modes "$ALL" \
            --json "$OUT/tuned_train_r$round.json" 2>&1 | tail -14 \
            | tee "$OUT/tuned_train_r$round.log"
    done
fi
if has warm; then
    for round in $(seq 1 "$ROUNDS"); do
        for mode in ndd_trace_loop ndd_trace transparent; do
            cache=$(mktemp -d)
            for start in cold warm; do
                NDD_TRACE_CACHE_DIR=$cache NDD_TRACE_LOGS=cache bounded python3 benchmarks/bench_ops.py \
                    $TRAIN --steps 20 --warmup 5 --modes "$mode,pipeline" \
                    --json "$OUT/warm_${mode}_${start}_r$round.json" 2>&1 | tail -5 \
                    | tee "$OUT/warm_${mode}_${start}_r$round.log"
            done
            ls -la "$cache" | tee -a "$OUT/warm_${mode}_cold_r$round.log"
        done
    done
fi
if has optshort; then
    bounded env NDD_TRACE_CACHE_DIR="$(mktemp -d)" python3 benchmarks/bench_ops.py $TRAIN \
        --steps "${OPTSHORT_STEPS:-400}" --modes ndd_trace_optimize,pipeline \
        --json "$OUT/optshort.json" 2>&1 | tail -6 | tee "$OUT/optshort.log"
fi
if has abunsteady; then  # bench_unsteady in each tree of AB_TREES, back to back
    for round in $(seq 1 "$ROUNDS"); do
        for tree in $AB_TREES; do
            (cd "${tree#*=}" && bounded python3 benchmarks/bench_unsteady.py --device gpu \
                --steps "${UNSTEADY_STEPS:-60}" --json "$OUT/unsteady_${tree%%=*}_r$round.json" 2>&1 \
                | tail -5 | tee "$OUT/unsteady_${tree%%=*}_r$round.log")
        done
    done
fi
if has parseahead; then  # the first result after a set-up, in each tree of AB_TREES
    for tree in $AB_TREES; do
        bounded python3 benchmarks/probe_parse_ahead.py --device gpu --rounds "$ROUNDS" \
            --tree "$PWD/${tree#*=}" --json "$OUT/parseahead_${tree%%=*}.json" 2>&1 | tail -4 \
            | tee "$OUT/parseahead_${tree%%=*}.log"
    done
fi
# one archive of everything written, beside the logs' tails printed above
(cd "$OUT" && files=$(ls | grep -v '^session.tgz$') && [ -n "$files" ] && tar czf session.tgz $files \
    && rm -f $files)
