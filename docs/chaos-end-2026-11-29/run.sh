#!/bin/sh
# The job's end under faults: jobs that end by themselves (--steps), short enough that servers
# are killed, frozen and moved near their end, so that one is often down as another finishes
# the job (the workers must tell it once it is back; it must end there, exit 0). First the
# seed that failed on 2026-11-29 (docs/chaos-move-2026-11-29, shm ssp 5304), with its flags.
# One line each in summary.txt, the JSONs beside it. Run from the repository root with the
# venv active.
set -u
. docs/chaos-run.sh
here=docs/chaos-end-2026-11-29
{
    chaos_run "$here" shm ssp 15000 5304 \
        move-server,kill-server,kill-worker,freeze-worker,drain-worker,freeze-server 0.3
    for spec in "shm asp 1500 5401" "shm ssp 1500 5402" "tcp asp 1500 5403" "shm bsp 1500 5404" \
        "tcp ssp 1500 5405" "shm asp 1500 5406" "tcp bsp 1500 5407" "shm ssp 1500 5408"; do
        set -- $spec
        chaos_run "$here" "$1" "$2" "$3" "$4" kill-server,freeze-server,move-server,kill-worker 0.2
    done
} | tee "$here/summary.txt"
