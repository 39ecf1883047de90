#!/bin/sh
# What a session lent a GPU runs first, in one device call (at most 550 s, within the device
# tool's 600 s a call; 4.6 minutes on an H200 on 2026-12-04 before bench-ps), so
# that the plan survives the sessions that have none. Each step's output goes to OUT/<step>.log,
# with its exit status and seconds at the end; a step that fails does not stop the others.
#
#   device run, carry [".gpu-bundle"] (`make gpu-bundle` builds it, ../shared/gpu/README.md):
#     . .gpu-bundle/device-setup.sh && sh bench/gpu_session.sh "$OUT"
#
# The steps, the widest check first (a session's device time is 15 minutes, start included):
#   info        nvidia-smi's GPU, driver and memory, and what `tensorwire info` says of the GPU,
#               CUDA and UCX's CUDA transports
#   gpu-tests   every test marked gpu
#   bench       the GPU rows of every transport with their references (d2d copy, pinned H2D,
#               raw NIXL VRAM WRITE, a torch.multiprocessing queue): issue 17's ratios (the
#               tables in bench.log)
#   bench-ps    whole jobs of the PyTorch CNN with GPU workers and GPU servers, per transport
#   probe       docs/bench-gpu-nixl-context/nixl_probe.py at 16 MiB: per-call medians of a nixl
#               sender that connects before it touches CUDA (215 GB/s on an H200, 2026-12-04)
#   proto       which UCX protocol the nixl transport's GPU puts take (UCX_PROTO_INFO)
# Then, as a second call: sh bench/gpu_packs.sh "$OUT" (packs of small parameters on GPU
# workers and servers, on and off in turn).
set -u
out=${1:?usage: sh bench/gpu_session.sh OUT}
mkdir -p "$out"

step() {  # NAME SECONDS COMMAND...: run it within SECONDS, its output in OUT/NAME.log
    name=$1
    limit=$2
    shift 2
    echo "== $name: $*"
    begun=$(date +%s)
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    code=$?
    echo "exit $code after $(($(date +%s) - begun)) s" >> "$out/$name.log"
    tail -n 4 "$out/$name.log"
}

step info 20 sh -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -m tensorwire info'
step gpu-tests 260 python3 -m pytest -q -rfEs -m gpu -p no:cacheprovider --timeout 90 \
    --durations 25
step bench 90 python3 -m tensorwire.bench --device cuda --sizes 4K,16M,64M \
    --transports shm,tcp,nixl --repeat 3 --no-progress --json "$out/bench-gpu.json"
step bench-ps 120 python3 -m tensorwire.bench ps --model examples/torch_digits.py:make \
    --worker-args "--device cuda" --ps-args "--device cuda" --steps 100 \
    --transports shm,tcp,nixl,grpc --json "$out/bench-ps-gpu.json"
step probe 30 python3 docs/bench-gpu-nixl-context/nixl_probe.py 16777216 cuda 300
step proto 30 env UCX_PROTO_INFO=y python3 -m tensorwire.bench --device cuda --sizes 16M \
    --transports nixl --repeat 1 --no-progress
# (the whole log is too large, and the device tool brings back at most 8 files: 8 here)
grep -h "ucp_put" "$out/proto.log" | sort | uniq -c | head -n 20 > "$out/proto-puts.txt"
tail -n 3 "$out/proto.log" >> "$out/proto-puts.txt"
rm -f "$out/proto.log"
echo "== done: $out"
