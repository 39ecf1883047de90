#!/bin/sh
# Every fault at once (servers killed, moved and frozen; workers killed, frozen, stopped and
# drained), jobs that end by themselves, after the job's end reached every server (dbe937a)
# and workers evicted to return (d1df8bf). One line each in mixed/summary.txt, the JSONs
# beside it. Run from the repository root with the venv active.
set -u
here=docs/chaos-end-2026-11-29/mixed
mkdir -p "$here"
events=kill-server,move-server,freeze-server,kill-worker,freeze-worker,stop-worker,drain-worker
for spec in "shm asp 6000 5501" "tcp ssp 6000 5502" "nixl bsp 4000 5503" "shm bsp 6000 5504" \
    "grpc-stream asp 2000 5505" "tcp asp 6000 5506"; do
    set -- $spec
    python -m tensorwire.bench chaos --transport "$1" --sync "$2" --steps "$3" --duration 400 \
        --events "$events" --gap 0.3 --stall 60 --seed "$4" --no-progress \
        --json "$here/$1-$2-$4.json" > "$here/$1-$2-$4.txt" 2>&1
    echo "$1 $2 steps $3 seed $4: exit $? $(tail -n 1 "$here/$1-$2-$4.txt")"
done | tee "$here/summary.txt"
