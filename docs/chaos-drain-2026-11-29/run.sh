#!/bin/sh
# `bench chaos --events drain-worker,...`: a worker stopped and left out (its node drained) while
# other faults come, servers killed among them, until the next drain starts it again; jobs that
# end by themselves (--steps), and two that end at a SIGTERM after --duration. One line each in
# summary.txt, the JSONs beside it. Run from the repository root with the venv active.
set -u
here=docs/chaos-drain-2026-11-29
events=drain-worker,kill-server,kill-worker,freeze-worker,stop-worker,freeze-server
for spec in "nixl asp 10000 5004" "shm bsp 15000 5011" "tcp asp 15000 5012" "shm ssp 15000 5013" \
    "nixl bsp 10000 5014" "tcp ssp 15000 5015" "grpc asp 3000 5016" "shm asp 15000 5017" \
    "tcp bsp 0 5018" "shm asp 0 5019"; do
    set -- $spec
    if [ "$3" = 0 ]; then length="--duration 60"; else length="--steps $3 --duration 400"; fi
    python -m tensorwire.bench chaos --transport "$1" --sync "$2" $length --events "$events" \
        --gap 0.3 --stall 60 --seed "$4" --no-progress \
        --json "$here/$1-$2-$4.json" > "$here/$1-$2-$4.txt" 2>&1
    echo "$1 $2 seed $4: exit $? $(tail -n 1 "$here/$1-$2-$4.txt")"
done | tee "$here/summary.txt"
