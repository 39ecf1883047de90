#!/bin/sh
# The runs of this folder (as root, from the repository's root): every TCP connection of a
# daemon reset (`bench chaos --events cut-connections`), alone and among the default faults,
# over each transport, then each daemon on a host of its own with CURVE.
set -u
out=docs/chaos-cut-2026-12-02
cut=cut-connections
every=kill-worker,freeze-worker,stop-worker,kill-server,freeze-server,cut-connections
run() {
  name=$1; shift
  .venv/bin/python -m tensorwire.bench chaos "$@" --json "$out/$name.json" --no-progress \
    > "$out/$name.txt" 2>&1
  echo "$name: exit $?" >> "$out/summary.txt"
  tail -n 3 "$out/$name.txt" >> "$out/summary.txt"
}
: > "$out/summary.txt"
for t in shm tcp nixl grpc grpc-stream; do
  run "$t-cut" --transport "$t" --events $cut --duration 60 --seed 11
  run "$t-every" --transport "$t" --events $every --duration 60 --seed 12
done
run tcp-separate-curve --transport tcp --hosts separate --curve --events $every --duration 60 --seed 13
# two more, run after the eleven above: a tcp job ending by itself through resets, kills and
# stops, and nixl with each daemon on a host of its own
.venv/bin/python -m tensorwire.bench chaos --transport tcp --steps 6000 --duration 200 \
  --events cut-connections,kill-worker,stop-worker,kill-server --gap 0.5 --seed 21 \
  --json "$out/tcp-steps-end.json" --no-progress
.venv/bin/python -m tensorwire.bench chaos --transport nixl --hosts separate \
  --events cut-connections,freeze-worker,kill-server --duration 60 --seed 22 \
  --json "$out/nixl-separate.json" --no-progress
# and two with every fault: tcp asp with every fault bench chaos makes (workers evicted), and
# grpc-stream ssp with each daemon on a host of its own, servers killed and moved
all=kill-worker,freeze-worker,stop-worker,drain-worker,kill-server,move-server,freeze-server,cut-connections
.venv/bin/python -m tensorwire.bench chaos --transport tcp --sync asp --events $all \
  --worker-args=--on-sigterm=restart --duration 60 --seed 31 \
  --json "$out/tcp-asp-every-fault.json" --no-progress
.venv/bin/python -m tensorwire.bench chaos --transport grpc-stream --sync ssp --hosts separate \
  --events cut-connections,kill-server,move-server,freeze-worker --duration 60 --seed 32 \
  --json "$out/grpc-stream-ssp-separate.json" --no-progress
