#!/bin/sh
# `bench chaos` with --clip-grad-norm over two shards (the workers add up the servers' norms
# each step), every fault kind, 120 s each: over shm with three workers, over tcp with three
# workers and adam, and over grpc with two workers. Run from the project root as root
# (cut-connections needs it); each job's table in <name>.txt, the whole run in <name>.json.
set -u
here=docs/chaos-clip-shards-2026-12-05
. bench/chaos_record.sh  # run NAME ARGS...: every fault kind, into $here/NAME.{txt,json}
run shm-bsp-clip-2x3-7301 --transport shm --servers 2 --workers 3 --duration 120 --seed 7301 \
    --ps-args "--clip-grad-norm 1.0"
run tcp-bsp-clip-adam-2x3-7302 --transport tcp --servers 2 --workers 3 --optimizer adam \
    --duration 120 --seed 7302 --ps-args "--clip-grad-norm 0.5"
run grpc-bsp-clip-2x2-7303 --transport grpc --servers 2 --workers 2 --duration 120 --seed 7303 \
    --ps-args "--clip-grad-norm 1.0"
