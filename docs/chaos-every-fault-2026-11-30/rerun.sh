#!/bin/sh
# Seed 5705 of run.sh again, after the harness's fix (a worker ending with the job as
# stop-worker's SIGTERM came was taken for one that failed to exit 143; the first run's output
# is shm-asp-5705-before-2.txt), and twice more with other seeds. Lines in summary-rerun.txt.
set -u
. docs/chaos-run.sh
here=docs/chaos-every-fault-2026-11-30
events=kill-worker,freeze-worker,stop-worker,drain-worker,kill-server,move-server,freeze-server
for seed in 5705 5707 5708; do
    chaos_run "$here" shm asp 4000 $seed "$events" 0.2 --servers 3 --workers 4 --optimizer adam \
        --worker-args="--on-sigterm restart"
done | tee "$here/summary-rerun.txt"
