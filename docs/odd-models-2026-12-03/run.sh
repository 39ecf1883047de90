#!/bin/bash
# (run from anywhere; logs and outputs go to $OUT, /tmp/odd-models by default)
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); OUT=${OUT:-/tmp/odd-models}; mkdir -p "$OUT"; cd "$OUT"
# run.sh MODEL PORT [ps flags...]: a 1-server, 1-worker job of 20 steps
m=$1; port=$2; shift 2
cd "$OUT"
PY=$ROOT/.venv/bin/python
$ROOT/.venv/bin/tensorwire-ps --bind tcp://127.0.0.1:$port --workers 1 --steps 20 --no-progress --log-level WARNING "$@" > ps-$m.log 2>&1 &
PS=$!
PYTHONPATH=$HERE timeout 120 $ROOT/.venv/bin/tensorwire-worker --servers tcp://127.0.0.1:$port --rank 0 --workers 1 --model oddmodels:$m --no-progress --log-level WARNING --save-params $OUT/out-$m.npz > w-$m.log 2>&1
echo "$m worker rc=$?"; wait $PS; echo "$m ps rc=$?"
tail -3 w-$m.log ps-$m.log
