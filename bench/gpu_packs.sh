#!/bin/sh
# A second device call for a session lent a GPU, after bench/gpu_session.sh: what packing small
# parameters (the servers' --pack-bytes, 256 KiB by default since 2026-12-04) does where each
# message costs a GPU copy's launch and its completion: the `many` model (200 tensors) as a
# PyTorch module on GPU workers and GPU servers, each parameter alone (--pack-bytes 0) and
# packed, in turn, over shm and nixl. At most 300 s; its output in OUT/packs.log and the
# results in OUT/packs-*.json (4 files).
#
#   device run, carry [".gpu-bundle"]:
#     . .gpu-bundle/device-setup.sh && sh bench/gpu_packs.sh "$OUT"
set -u
out=${1:?usage: sh bench/gpu_packs.sh OUT}
mkdir -p "$out"
begun=$(date +%s)
for round in 1 2; do
    for packs in 0 262144; do
        echo "== round $round, --pack-bytes $packs" >> "$out/packs.log"
        timeout 70 python3 -m tensorwire.bench ps --model many --framework torch \
            --worker-args "--device cuda" --ps-args "--device cuda --pack-bytes $packs" \
            --steps 60 --transports shm,nixl \
            --json "$out/packs-$packs-r$round.json" >> "$out/packs.log" 2>&1
        echo "exit $? after $(($(date +%s) - begun)) s" >> "$out/packs.log"
    done
done
grep -E "^ +(shm|nixl) |^== |^exit" "$out/packs.log"
