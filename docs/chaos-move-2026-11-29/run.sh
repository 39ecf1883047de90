#!/bin/sh
# `bench chaos --events move-server,...`: servers run with --on-sigterm restart and are moved
# (SIGTERM: each checkpoints where the job is and exits 0, the workers not told) and started
# again, among kills, freezes and drained workers; jobs that end by themselves (--steps). One
# line each in summary.txt, the JSONs beside it. Run from the repository root with the venv
# active.
set -u
here=docs/chaos-move-2026-11-29
events=move-server,kill-server,kill-worker,freeze-worker,drain-worker,freeze-server
for spec in "shm bsp 15000 5301" "tcp asp 15000 5302" "nixl ssp 10000 5303" "shm ssp 15000 5304" \
    "tcp bsp 15000 5305" "grpc-stream bsp 3000 5306"; do
    set -- $spec
    python -m tensorwire.bench chaos --transport "$1" --sync "$2" --steps "$3" --duration 400 \
        --events "$events" --gap 0.3 --stall 60 --seed "$4" --no-progress \
        --json "$here/$1-$2-$4.json" > "$here/$1-$2-$4.txt" 2>&1
    echo "$1 $2 seed $4: exit $? $(tail -n 1 "$here/$1-$2-$4.txt")"
done | tee "$here/summary.txt"
