#!/bin/bash
# (run from anywhere; logs and outputs go to $OUT, /tmp/odd-models by default)
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); OUT=${OUT:-/tmp/odd-models}; mkdir -p "$OUT"; cd "$OUT"
port=5871
PS=$ROOT/.venv/bin/tensorwire-ps; W=$ROOT/.venv/bin/tensorwire-worker
$PS --bind tcp://127.0.0.1:$port --workers 2 --steps 400 --no-progress --log-level WARNING --checkpoint-dir $OUT/ck --checkpoint-every 100 > ps-r1.log 2>&1 &
for r in 0 1; do $W --servers tcp://127.0.0.1:$port --rank $r --workers 2 --no-progress --log-level WARNING > w-r1-$r.log 2>&1 & done
wait
echo "first job:"; tail -n1 ps-r1.log
timeout 100 $PS --bind tcp://127.0.0.1:$port --workers 3 --steps 800 --no-progress --log-level INFO --checkpoint-dir $OUT/ck --checkpoint-every 100 --resume --join-timeout 20 > ps-r2.log 2>&1 &
for r in 0 1 2; do timeout 100 $W --servers tcp://127.0.0.1:$port --rank $r --workers 3 --no-progress --log-level WARNING > w-r2-$r.log 2>&1 & done
wait
tail -n 3 ps-r2.log w-r2-0.log w-r2-2.log | cut -c1-300
