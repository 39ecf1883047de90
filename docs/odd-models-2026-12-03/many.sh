#!/bin/bash
# (run from anywhere; logs go to $OUT, /tmp/odd-models by default)
# many.sh PORT: two workers of oddmodels:many (1004 parameter tensors of 16x16 and the rest), 200 steps
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); OUT=${OUT:-/tmp/odd-models}; mkdir -p "$OUT"; cd "$OUT"
port=$1; shift
PS=$ROOT/.venv/bin/tensorwire-ps; W=$ROOT/.venv/bin/tensorwire-worker
/usr/bin/time -f "ps %e s %U u" $PS --bind tcp://127.0.0.1:$port --workers 2 --steps 200 --no-progress --log-level INFO --metrics $OUT/many-ps.json "$@" > ps-many.log 2>&1 &
for r in 0 1; do PYTHONPATH=$HERE /usr/bin/time -f "w$r %e s %U u" $W --servers tcp://127.0.0.1:$port --rank $r --workers 2 --model oddmodels:many --no-progress --log-level WARNING --metrics $OUT/many-w$r.json > w-many-$r.log 2>&1 & done
wait
tail -n 2 ps-many.log w-many-0.log
