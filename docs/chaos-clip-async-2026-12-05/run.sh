#!/bin/sh
# `bench chaos` with --clip-grad-norm under asp and ssp (each push clipped by the norm of the
# worker's whole gradient, which its meta brings: the push's gradients wait in their slots for
# it), every fault kind, 120 s each, two shards: asp over shm with three workers, ssp over tcp
# with three workers and momentum. Run from the project root as root (cut-connections needs
# it); each job's table in <name>.txt, the whole run in <name>.json.
set -u
here=docs/chaos-clip-async-2026-12-05
. bench/chaos_record.sh  # run NAME ARGS...: every fault kind, into $here/NAME.{txt,json}
run shm-asp-clip-2x3-7401 --transport shm --servers 2 --workers 3 --sync asp --duration 120 \
    --seed 7401 --ps-args "--clip-grad-norm 1.0"
run tcp-ssp-clip-momentum-2x3-7402 --transport tcp --servers 2 --workers 3 --sync ssp \
    --optimizer momentum --duration 120 --seed 7402 --ps-args "--clip-grad-norm 0.5"
# (the two above ran at 19429b7; the two below at 50c4cda, whose worker takes a torch
# gradient's norm otherwise: these workers are numpy's)
run grpc-asp-clip-2x2-7403 --transport grpc --servers 2 --workers 2 --sync asp --duration 120 \
    --seed 7403 --ps-args "--clip-grad-norm 1.0"
run nixl-ssp-clip-bf16-2x3-7404 --transport nixl --servers 2 --workers 3 --sync ssp \
    --wire-dtype bfloat16 --duration 120 --seed 7404 --ps-args "--clip-grad-norm 1.0"
# (at 86c5a29: the workers of the first in torch, whose norm torch's multi-tensor norm takes;
# the second, the 1000 small tensors of `many`, most of them in packs, each held whole)
run shm-ssp-clip-torch-2x3-7405 --transport shm --servers 2 --workers 3 --sync ssp \
    --framework torch --duration 120 --seed 7405 --ps-args "--clip-grad-norm 0.5"
run tcp-asp-clip-many-2x2-7406 --transport tcp --servers 2 --workers 2 --sync asp \
    --model many --duration 120 --seed 7406 --ps-args "--clip-grad-norm 1.0"
