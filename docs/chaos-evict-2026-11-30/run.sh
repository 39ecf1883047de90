#!/bin/sh
# Workers run as deploy/k8s runs them (--on-sigterm restart): stop-worker and drain-worker are
# evictions (each leaves saying it will be back and exits 143; the servers wait for it as for
# one lost), among server kills, moves and freezes and worker kills; jobs that end by
# themselves (--steps). One line each in summary.txt, the JSONs beside it. Run from the
# repository root with the venv active.
set -u
. docs/chaos-run.sh
here=docs/chaos-evict-2026-11-30
events=stop-worker,drain-worker,kill-worker,freeze-worker,kill-server,move-server,freeze-server
for spec in "shm asp 6000 5601" "tcp ssp 6000 5602" "shm bsp 6000 5603" "nixl asp 4000 5604" \
    "tcp asp 6000 5605" "grpc-stream ssp 2000 5606"; do
    set -- $spec
    chaos_run "$here" "$1" "$2" "$3" "$4" "$events" 0.3 --worker-args="--on-sigterm restart"
done | tee "$here/summary.txt"
