#!/bin/sh
# Four jobs that end by themselves with every fault, in combinations the earlier records did not
# hold (grpc-stream under asp and nixl under bsp with every daemon on a host of its own, grpc
# under ssp with torch workers, tcp under ssp with float16 on the wire, Adam and CURVE). One line
# each in summary.txt, the JSONs beside it. Run from the repository root with the venv active.
set -u
. docs/chaos-run.sh
here=docs/chaos-2026-12-02
events=kill-worker,freeze-worker,stop-worker,drain-worker,kill-server,move-server,freeze-server
restart=--worker-args="--on-sigterm restart"
{
chaos_run "$here" grpc-stream asp 2000 6001 "$events" 0.3 --hosts separate "$restart"
chaos_run "$here" nixl bsp 3000 6002 "$events" 0.3 --hosts separate --servers 3
chaos_run "$here" grpc ssp 1500 6003 "$events" 0.3 --framework torch "$restart"
chaos_run "$here" tcp ssp 3000 6004 "$events" 0.3 --wire-dtype float16 --optimizer adam --curve
} | tee "$here/summary.txt"
# Then the same four combinations again, longer (more faults each), with new seeds.
{
chaos_run "$here" grpc-stream asp 6000 6011 "$events" 0.2 --hosts separate "$restart"
chaos_run "$here" nixl bsp 8000 6012 "$events" 0.2 --hosts separate --servers 3
chaos_run "$here" grpc ssp 4000 6013 "$events" 0.2 --framework torch "$restart"
chaos_run "$here" tcp ssp 10000 6014 "$events" 0.2 --wire-dtype float16 --optimizer adam --curve
} | tee -a "$here/summary.txt"
