#!/bin/sh
# shm's GPU completion paths side by side, on a machine with a GPU: TENSORWIRE_GPU_STREAM_STORES=0
# (write waits for its copy, or the channel's thread completes a copy of 32 MiB or more) against
# =1, the default (the GPU stores each sequence number behind its copy). Two rounds,
# alternated, so that drift between runs shows; JSON and Markdown tables into DIR.
#
#   sh bench/gpu_completion_ab.sh DIR [RING]     (RING: slots per tensor; default the receiver's)
set -eu
out=${1:?usage: sh bench/gpu_completion_ab.sh DIR [RING]}
ring=${2:-}
mkdir -p "$out"
for round in 1 2; do
    for stores in 0 1; do
        name="$out/stores$stores-round$round"
        echo "== TENSORWIRE_GPU_STREAM_STORES=$stores, round $round"
        TENSORWIRE_GPU_STREAM_STORES=$stores python3 -m tensorwire.bench --device cuda \
            --sizes 4K,64K,1M,16M,64M --transports shm --repeat 3 --round-trips 300 \
            ${ring:+--ring "$ring"} --no-progress --json "$name.json" --markdown "$name.md"
    done
done
