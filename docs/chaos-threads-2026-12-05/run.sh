#!/bin/sh
# `bench chaos` with PyTorch workers, after --threads auto (06731a1): each worker counts the
# workers on the host as it joins, which faults change (killed, frozen, restarted, drained).
# Every fault kind, 120 s each, from the project root as root; each job's table in <name>.txt,
# the whole run in <name>.json.
set -u
here=docs/chaos-threads-2026-12-05
. bench/chaos_record.sh  # run NAME ARGS...: every fault kind, into $here/NAME.{txt,json}
run shm-asp-torch-2x3-7601 --transport shm --servers 2 --workers 3 --sync asp \
    --framework torch --duration 120 --seed 7601
# (its first try, at 4a9a6ca, stopped at once: bench chaos then gave the workers --framework
# numpy by default, and a factory of a torch module; since 803e9a0 auto is the default, and
# --framework numpy with such a factory is refused before the run)
run tcp-bsp-torchcnn-1x3-7602 --transport tcp --servers 1 --workers 3 \
    --model examples/torch_digits.py:make --optimizer momentum --duration 120 --seed 7602
