#!/bin/bash
# (run from anywhere; logs go to $OUT, /tmp/odd-models by default)
# Jobs of two shards set up wrong: the worker's --servers in reverse order (works), one of the
# two servers left out, both servers started as shard 1, and shards of different --split-bytes.
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); OUT=${OUT:-/tmp/odd-models}; mkdir -p "$OUT"; cd "$OUT"
PS=$ROOT/.venv/bin/tensorwire-ps; W=$ROOT/.venv/bin/tensorwire-worker
two() {  # two(shard of A, shard of B, servers given to the worker, extra flags of B...)
    a=$1; b=$2; given=$3; shift 3
    timeout 60 $PS --bind tcp://127.0.0.1:5931 --shard $a --shards 2 --workers 1 --steps 200 --no-progress --log-level WARNING --join-timeout 5 > ps-a.log 2>&1 &
    timeout 60 $PS --bind tcp://127.0.0.1:5932 --shard $b --shards 2 --workers 1 --steps 200 --no-progress --log-level WARNING --join-timeout 5 "$@" > ps-b.log 2>&1 &
    timeout 60 $W --servers $given --rank 0 --workers 1 --no-progress --log-level WARNING 2>&1 | tail -n 1
    wait
}
echo "== reversed";   two 0 1 tcp://127.0.0.1:5932,tcp://127.0.0.1:5931
echo "== one of two"; two 0 1 tcp://127.0.0.1:5931
echo "== shard twice"; two 1 1 tcp://127.0.0.1:5931,tcp://127.0.0.1:5932
echo "== split-bytes"; two 0 1 tcp://127.0.0.1:5931,tcp://127.0.0.1:5932 --split-bytes 16384
