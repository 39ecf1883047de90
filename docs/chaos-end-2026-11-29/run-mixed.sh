#!/bin/sh
# Every fault at once (servers killed, moved and frozen; workers killed, frozen, stopped and
# drained), jobs that end by themselves, after the job's end reached every server (dbe937a)
# and workers evicted to return (d1df8bf). One line each in mixed/summary.txt, the JSONs
# beside it. Run from the repository root with the venv active.
set -u
. docs/chaos-run.sh
here=docs/chaos-end-2026-11-29/mixed
mkdir -p "$here"
events=kill-server,move-server,freeze-server,kill-worker,freeze-worker,stop-worker,drain-worker
for spec in "shm asp 6000 5501" "tcp ssp 6000 5502" "nixl bsp 4000 5503" "shm bsp 6000 5504" \
    "grpc-stream asp 2000 5505" "tcp asp 6000 5506"; do
    set -- $spec
    chaos_run "$here" "$1" "$2" "$3" "$4" "$events" 0.3
done | tee "$here/summary.txt"
