#!/usr/bin/env bash
# Exit codes under load: RUNS runs (in PARALLEL streams) of a script that raises mid-epoch in a
# reader loop under `python -m ndd_trace`, with two busy processes beside them; every run must
# exit with the script's own code, 1. Prints the count of each exit code.
#     RUNS=200 PARALLEL=4 bash benchmarks/exit_soak.sh
set -u
RUNS=${RUNS:-200}
PARALLEL=${PARALLEL:-1}
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
yes > /dev/null & busy1=$!
yes > /dev/null & busy2=$!
per=$(( RUNS / PARALLEL ))
for s in $(seq 1 "$PARALLEL"); do
  ( for i in $(seq 1 "$per"); do
      "$PY" -m ndd_trace tests/scripts/raise_mid_epoch.py > /dev/null 2>&1; echo $?
    done ) > "/tmp/ndd_trace_soak.$s" &
done
wait $(jobs -p | grep -v -e "^$busy1$" -e "^$busy2$") 2>/dev/null
kill $busy1 $busy2
cat /tmp/ndd_trace_soak.* | sort | uniq -c | sed 's/^/exit code count: /'
