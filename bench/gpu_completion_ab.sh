#!/bin/sh
# shm's GPU completion paths side by side, on a machine with a GPU: TENSORWIRE_GPU_STREAM_STORES=0
# (write waits for its copy, or the channel's thread completes a copy of 32 MiB or more) against
# =1, the default (the GPU stores each sequence number behind its copy). Two rounds,
# alternated, so that drift between runs shows; JSON and Markdown tables into DIR, then one table
# of the four runs side by side on stdout.
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
# One table of the four runs: shm GB/s (its ratio to d2d in the same run) and the 4 KiB round trip
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path

from tensorwire.bench.common import human

out = Path(sys.argv[1])
runs = [(f"stores {'on' if s else 'off'}, round {r}", out / f"stores{s}-round{r}.json")
        for r in (1, 2) for s in (0, 1)]
sizes = None
for label, path in runs:
    result = json.loads(path.read_text())
    shm = {row["size"]: row for row in result["throughput"] if row["method"] == "shm"}
    sizes = sizes or sorted(shm)
    if label.endswith("off, round 1"):
        print("| run | " + " | ".join(human(s) for s in sizes) + " | 4 KiB round trip |")
        print("|---|" + "---:|" * (len(sizes) + 1))
    rtt = next(l["median_us"] for l in result["latency"] if l["method"] == "shm")
    cells = [f"{shm[s]['gbps']:.4g} ({shm[s]['x_limit'] or 0:.2f})" for s in sizes]
    print(f"| {label} | " + " | ".join(cells) + f" | {rtt:.0f} us |")
PY
