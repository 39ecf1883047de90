#!/bin/sh
# `bench chaos` on combinations no chaos run had met together: packs (the default) over two
# shards with a 16-bit wire, a PyTorch transformer, and the faults that move a server or cut
# every connection of a daemon. Run from the project root; each job's table in <name>.txt.
set -u
here=docs/chaos-combos-2026-12-04
all=kill-worker,freeze-worker,stop-worker,drain-worker,kill-server,move-server,freeze-server,cut-connections
python=${PYTHON:-.venv/bin/python}
$python -m tensorwire.bench chaos --transport tcp --sync bsp --servers 2 --workers 3 \
    --model examples/torch_tiny_lm.py:make --framework torch --optimizer adamw \
    --wire-dtype bfloat16 --ps-args "--lr 0.01 --weight-decay 0.01" --events "$all" \
    --duration 120 --seed 6501 --no-progress --json "$here/tcp-bsp-tinylm-bf16-6501.json" \
    > "$here/tcp-bsp-tinylm-bf16-6501.txt" 2>&1
echo "exit $?" >> "$here/tcp-bsp-tinylm-bf16-6501.txt"
$python -m tensorwire.bench chaos --transport nixl --sync ssp --servers 2 --workers 3 \
    --model many --optimizer adam --wire-dtype float16 --events "$all" \
    --duration 120 --seed 6502 --no-progress --json "$here/nixl-ssp-many-f16-6502.json" \
    > "$here/nixl-ssp-many-f16-6502.txt" 2>&1
echo "exit $?" >> "$here/nixl-ssp-many-f16-6502.txt"
# (later the same night, at 851167b and after)
$python -m tensorwire.bench chaos --transport grpc-stream --sync asp --servers 2 --workers 3 \
    --model examples/torch_digits.py:make --framework torch --optimizer momentum --curve \
    --hosts separate --events "$all" --duration 90 --seed 6503 --no-progress \
    --json "$here/grpcstream-asp-torchcnn-curve-separate-6503.json" \
    > "$here/grpcstream-asp-torchcnn-curve-separate-6503.txt" 2>&1
echo "exit $?" >> "$here/grpcstream-asp-torchcnn-curve-separate-6503.txt"
$python -m tensorwire.bench chaos --transport shm --sync bsp --servers 3 --workers 4 \
    --model large --optimizer momentum --ps-args "--serve-threads 0" --events "$all" \
    --duration 90 --seed 6504 --min-accuracy 0 --no-progress --json "$here/shm-bsp-large-3x4-6504.json" \
    > "$here/shm-bsp-large-3x4-6504.txt" 2>&1
echo "exit $?" >> "$here/shm-bsp-large-3x4-6504.txt"
