#!/bin/sh
# `bench chaos` on combinations no chaos run had met together (2026-12-05): gRPC under ssp
# over three shards with two workers, and a PyTorch job under asp with each daemon on a host of
# its own; every fault kind, drains and moved servers among them. Run from the project root
# (as root: cut-connections and --hosts separate need it); each job's table in <name>.txt.
set -u
here=docs/chaos-combos-2026-12-05
all=kill-worker,freeze-worker,stop-worker,drain-worker,kill-server,move-server,freeze-server,cut-connections
python=${PYTHON:-.venv/bin/python}
$python -m tensorwire.bench chaos --transport grpc --servers 3 --workers 2 --sync ssp \
    --optimizer momentum --events "$all" --duration 120 --seed 7101 \
    --json "$here/grpc-ssp-3x2-momentum-7101.json" > "$here/grpc-ssp-3x2-momentum-7101.txt" 2>&1
echo "exit $?" >> "$here/grpc-ssp-3x2-momentum-7101.txt"
$python -m tensorwire.bench chaos --transport tcp --hosts separate --servers 2 --workers 3 \
    --sync asp --framework torch --wire-dtype bfloat16 --optimizer adam --events "$all" \
    --duration 120 --seed 7102 --json "$here/tcp-asp-torch-bf16-adam-separate-7102.json" \
    > "$here/tcp-asp-torch-bf16-adam-separate-7102.txt" 2>&1
echo "exit $?" >> "$here/tcp-asp-torch-bf16-adam-separate-7102.txt"
$python -m tensorwire.bench chaos --transport nixl --servers 2 --workers 3 --sync ssp \
    --optimizer adamw --events "$all" --steps 9000 --duration 300 --seed 7103 \
    --json "$here/nixl-ssp-2x3-adamw-steps-7103.json" > "$here/nixl-ssp-2x3-adamw-steps-7103.txt" 2>&1
echo "exit $?" >> "$here/nixl-ssp-2x3-adamw-steps-7103.txt"
# the run's own defect, found by the first: before 1cf49e2, seed 1 of this short run fails
$python -m tensorwire.bench chaos --workers 2 --sync asp --events drain-worker,stop-worker \
    --seed 1 --duration 3 --min-faults 2 --stall 60 --gap 0.5 --no-progress \
    --json "$here/asp-drain-stop-seed1.json" > "$here/asp-drain-stop-seed1.txt" 2>&1
echo "exit $?" >> "$here/asp-drain-stop-seed1.txt"
