#!/bin/sh
# `bench chaos` with --clip-grad-norm on combinations not run before, every fault kind, 120 s
# each: bsp over three shards (the workers add up three servers' norms) over grpc-stream; asp
# over tcp with each daemon on a host of its own (pid and mount namespaces); ssp with adamw and
# a float16 wire over shm. Run from the project root as root (cut-connections and --hosts
# separate need it); each job's table in <name>.txt, the whole run in <name>.json.
set -u
here=docs/chaos-clip-more-2026-12-05
. bench/chaos_record.sh  # run NAME ARGS...: every fault kind, into $here/NAME.{txt,json}
run grpc-stream-bsp-clip-3x3-7501 --transport grpc-stream --servers 3 --workers 3 \
    --duration 120 --seed 7501 --ps-args "--clip-grad-norm 1.0"
run tcp-asp-clip-hosts-2x3-7502 --transport tcp --servers 2 --workers 3 --sync asp \
    --hosts separate --duration 120 --seed 7502 --ps-args "--clip-grad-norm 1.0"
run shm-ssp-clip-adamw-f16-2x3-7503 --transport shm --servers 2 --workers 3 --sync ssp \
    --optimizer adamw --wire-dtype float16 --duration 120 --seed 7503 \
    --ps-args "--clip-grad-norm 0.5"
# (then, at 6389a2a, whose code is f8930c6's: over nixl, three shards adding up norms; asp
# with the control plane encrypted by CURVE, two shards, over shm)
run nixl-bsp-clip-3x2-7504 --transport nixl --servers 3 --workers 2 --duration 120 \
    --seed 7504 --ps-args "--clip-grad-norm 1.0"
run shm-asp-clip-curve-2x3-7505 --transport shm --servers 2 --workers 3 --sync asp --curve \
    --duration 120 --seed 7505 --ps-args "--clip-grad-norm 1.0"
