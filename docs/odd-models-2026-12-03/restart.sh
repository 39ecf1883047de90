#!/bin/bash
# (run from anywhere; logs and checkpoints go to $OUT, /tmp/odd-models by default)
# A job of 300 steps checkpointed in a directory, then a server started there again without
# --resume (a whole job started again without the flag): what becomes of the first checkpoint.
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); OUT=${OUT:-/tmp/odd-models}; mkdir -p "$OUT"; cd "$OUT"
PS=$ROOT/.venv/bin/tensorwire-ps; W=$ROOT/.venv/bin/tensorwire-worker; PY=$ROOT/.venv/bin/python
rm -rf ck-restart
step() { $PY -c "import numpy as np, sys; print(int(np.load(sys.argv[1])['__step__']))" "$1"; }
for steps in 300 150; do
    $PS --bind tcp://127.0.0.1:5942 --workers 1 --steps $steps --no-progress --log-level WARNING --checkpoint-dir ck-restart --checkpoint-every 100 > ps-restart-$steps.log 2>&1 &
    $W --servers tcp://127.0.0.1:5942 --rank 0 --workers 1 --no-progress --log-level WARNING > w-restart-$steps.log 2>&1
    wait
    for f in ck-restart/ps-shard0.npz*; do echo "after the job of $steps steps: $f at step $(step $f)"; done
done
cat ps-restart-150.log
