#!/bin/bash
# (run from anywhere; logs and outputs go to $OUT, /tmp/odd-models by default)
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); OUT=${OUT:-/tmp/odd-models}; mkdir -p "$OUT"; cd "$OUT"
port=5851
PS=$ROOT/.venv/bin/tensorwire-ps; W=$ROOT/.venv/bin/tensorwire-worker
timeout 120 $PS --bind tcp://127.0.0.1:$port --workers 2 --steps 20000 --no-progress --log-level INFO > ps-sw.log 2>&1 &
PSP=$!
PYTHONPATH=$HERE timeout 120 $W --servers tcp://127.0.0.1:$port --rank 0 --workers 2 --model oddmodels:switch --no-progress --log-level INFO > w-sw-0.log 2>&1 &
PYTHONPATH=$HERE $W --servers tcp://127.0.0.1:$port --rank 1 --workers 2 --model oddmodels:switch --no-progress --log-level INFO > w-sw-1.log 2>&1 &
W1=$!
sleep 6; kill -9 $W1; sleep 1
SWITCH=1 PYTHONPATH=$HERE timeout 60 $W --servers tcp://127.0.0.1:$port --rank 1 --workers 2 --model oddmodels:switch --no-progress --log-level INFO > w-sw-1b.log 2>&1
echo "restarted w1 rc=$?"
sleep 5; echo "ps alive? $(kill -0 $PSP 2>/dev/null && echo yes || echo no)"
tail -n 4 ps-sw.log w-sw-1b.log w-sw-0.log | cut -c1-300
kill $PSP 2>/dev/null; wait
