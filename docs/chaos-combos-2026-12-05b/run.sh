#!/bin/sh
# `bench chaos` on combinations no chaos run had met together (2026-12-05, second set): a BSP
# job with a clipped gradient, a learning-rate schedule with warm-up and parallel serving over
# one shard; gRPC streams over CURVE with four workers; and nixl with each daemon on a host of
# its own. Every fault kind, drains and moved servers among them. Run from the project root as
# root (cut-connections and --hosts separate need it); each job's table in <name>.txt.
set -u
here=docs/chaos-combos-2026-12-05b
. bench/chaos_record.sh  # run NAME ARGS...: every fault kind, into $here/NAME.{txt,json}
run tcp-bsp-clip-cosine-serve-threads-7201 --transport tcp --servers 1 --workers 3 \
    --optimizer momentum --duration 120 --seed 7201 \
    --ps-args "--clip-grad-norm 1.0 --lr-schedule cosine --warmup-steps 200 --serve-threads 0"
run grpc-stream-bsp-curve-1x4-7202 --transport grpc-stream --servers 1 --workers 4 --curve \
    --optimizer adamw --duration 120 --seed 7202
run nixl-bsp-separate-2x3-7203 --transport nixl --hosts separate --servers 2 --workers 3 \
    --duration 120 --seed 7203
