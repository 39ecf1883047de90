#!/bin/sh
# Workers run as deploy/k8s runs them (--on-sigterm restart): stop-worker and drain-worker are
# evictions (each leaves saying it will be back and exits 143; the servers wait for it as for
# one lost), among server kills, moves and freezes and worker kills; jobs that end by
# themselves (--steps). One line each in summary.txt, the JSONs beside it. Run from the
# repository root with the venv active.
set -u
here=docs/chaos-evict-2026-11-30
events=stop-worker,drain-worker,kill-worker,freeze-worker,kill-server,move-server,freeze-server
for spec in "shm asp 6000 5601" "tcp ssp 6000 5602" "shm bsp 6000 5603" "nixl asp 4000 5604" \
    "tcp asp 6000 5605" "grpc-stream ssp 2000 5606"; do
    set -- $spec
    python -m tensorwire.bench chaos --transport "$1" --sync "$2" --steps "$3" --duration 400 \
        --events "$events" --gap 0.3 --stall 60 --seed "$4" --no-progress \
        --worker-args="--on-sigterm restart" \
        --json "$here/$1-$2-$4.json" > "$here/$1-$2-$4.txt" 2>&1
    echo "$1 $2 steps $3 seed $4: exit $? $(tail -n 1 "$here/$1-$2-$4.txt")"
done | tee "$here/summary.txt"
