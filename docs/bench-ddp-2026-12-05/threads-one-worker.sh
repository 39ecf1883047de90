#!/bin/sh
# One worker and one server (no other worker on the host): torch's two threads (one per core
# here) against one, for `many` and `large` in PyTorch; then the numpy `many` with and without
# OMP_NUM_THREADS=1. At 06731a1, from the repository's root, three rounds each.
set -u
here=docs/bench-ddp-2026-12-05/threads-one-worker
mkdir -p "$here"
py=.venv/bin/python
for model in many large; do
    for n in 2 1; do
        $py -m tensorwire.bench ps --workers 1 --transports shm --repeat 3 --model $model \
            --framework torch --steps 60 --worker-args "--threads $n" \
            --json "$here/$model-threads$n.json" > "$here/$model-threads$n.txt" 2>&1
    done
done
$py -m tensorwire.bench ps --transports shm,tcp --repeat 3 --model many --steps 60 \
    --json "$here/numpy-many.json" > "$here/numpy-many.txt" 2>&1
OMP_NUM_THREADS=1 $py -m tensorwire.bench ps --transports shm,tcp --repeat 3 --model many \
    --steps 60 --json "$here/numpy-many-omp1.json" > "$here/numpy-many-omp1.txt" 2>&1
