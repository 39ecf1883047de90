#!/bin/bash
# (run from anywhere; logs and outputs go to $OUT, /tmp/odd-models by default)
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); OUT=${OUT:-/tmp/odd-models}; mkdir -p "$OUT"; cd "$OUT"
port=5861
PS=$ROOT/.venv/bin/tensorwire-ps; W=$ROOT/.venv/bin/tensorwire-worker
start=$(date +%s)
timeout 150 $PS --bind tcp://127.0.0.1:$port --workers 2 --steps 20000 --no-progress --log-level INFO > ps-dup.log 2>&1 &
for i in a b; do timeout 150 $W --servers tcp://127.0.0.1:$port --rank 0 --workers 2 --no-progress --log-level INFO > w-dup-$i.log 2>&1 & sleep 1; done
sleep 3
timeout 150 $W --servers tcp://127.0.0.1:$port --rank 1 --workers 2 --no-progress --log-level INFO > w-dup-1.log 2>&1 &
wait
echo "took $(( $(date +%s) - start )) s"
tail -n 4 ps-dup.log w-dup-a.log w-dup-b.log w-dup-1.log | cut -c1-350
