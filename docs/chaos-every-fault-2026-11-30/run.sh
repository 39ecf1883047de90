#!/bin/sh
# make chaos's fifth run (five minutes over shm, asp, every fault, the workers run as deploy/k8s
# runs them) by itself, then six jobs that end by themselves with every fault, in settings the
# earlier records did not combine (torch workers, three servers, --hosts separate, --curve,
# bfloat16 with adam over grpc). One line each in summary.txt, the JSONs beside it. Run from
# the repository root with the venv active.
set -u
. docs/chaos-run.sh
here=docs/chaos-every-fault-2026-11-30
events=kill-worker,freeze-worker,stop-worker,drain-worker,kill-server,move-server,freeze-server
{
python -m tensorwire.bench chaos --transport shm --sync asp --events "$events" \
    --worker-args=--on-sigterm=restart --duration 300 --seed 5730 --no-progress \
    --json "$here/make-chaos-5th.json" > "$here/make-chaos-5th.txt" 2>&1
echo "make chaos's fifth run, seed 5730: exit $? $(tail -n 1 "$here/make-chaos-5th.txt")"
restart=--worker-args="--on-sigterm restart"
chaos_run "$here" shm ssp 3000 5701 "$events" 0.3 --servers 3 --framework torch "$restart"
chaos_run "$here" tcp bsp 3000 5702 "$events" 0.3 --hosts separate "$restart"
chaos_run "$here" nixl ssp 3000 5703 "$events" 0.3 --curve --optimizer momentum
chaos_run "$here" grpc asp 1500 5704 "$events" 0.3 --wire-dtype bfloat16 --optimizer adam "$restart"
chaos_run "$here" shm asp 4000 5705 "$events" 0.2 --servers 3 --workers 4 --optimizer adam "$restart"
chaos_run "$here" tcp asp 3000 5706 "$events" 0.3 --framework torch --hosts separate
} | tee "$here/summary.txt"
