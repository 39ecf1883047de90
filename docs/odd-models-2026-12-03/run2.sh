#!/bin/bash
# (run from anywhere; logs and outputs go to $OUT, /tmp/odd-models by default)
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); OUT=${OUT:-/tmp/odd-models}; mkdir -p "$OUT"; cd "$OUT"
m=$1; port=$2; shift 2
PS=$ROOT/.venv/bin/tensorwire-ps; W=$ROOT/.venv/bin/tensorwire-worker
start=$(date +%s)
timeout 100 $PS --bind tcp://127.0.0.1:$port --workers 2 --steps 20 --no-progress --log-level WARNING "$@" > ps-$m.log 2>&1 &
for r in 0 1; do PYTHONPATH=$HERE timeout 100 $W --servers tcp://127.0.0.1:$port --rank $r --workers 2 --model oddmodels:$m --no-progress --log-level WARNING > w-$m-$r.log 2>&1 & done
wait
echo "== $m took $(( $(date +%s) - start )) s"; tail -n 3 ps-$m.log w-$m-0.log w-$m-1.log | cut -c1-400
