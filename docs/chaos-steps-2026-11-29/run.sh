#!/bin/sh
# `bench chaos --steps`: jobs that end by themselves while their daemons are killed, frozen and
# stopped at random, short, so that faults meet the end (a worker started again after it, a
# server restarted from the checkpoint of the last step). Three seeds a transport; the JSONs
# and one line each beside this script. Run from the repository root with the venv active.
set -u
here=docs/chaos-steps-2026-11-29
for spec in "shm bsp 4000" "tcp asp 4000" "nixl bsp 4000" "grpc-stream ssp 1500" "grpc bsp 1500"; do
    set -- $spec
    for k in 1 2 3; do
        seed=45$k$(echo "$1" | wc -c)
        python -m tensorwire.bench chaos --transport "$1" --sync "$2" --steps "$3" \
            --duration 300 --gap 0.3 --stall 60 --seed "$seed" --no-progress \
            --json "$here/$1-$2-$seed.json" > "$here/$1-$2-$seed.txt" 2>&1
        echo "$1 $2 seed $seed: exit $? $(tail -n 1 "$here/$1-$2-$seed.txt")"
    done
done | tee "$here/summary.txt"
