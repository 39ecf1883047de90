#!/bin/sh
# The parameter server against PyTorch's DistributedDataParallel over gloo (bench ps --ddp) on
# the project's 2-core VM, from the repository's root: one server and two workers per job (DDP:
# two processes), every model in PyTorch, three rounds, medians. `sh run.sh DIR`:
#   torch-default-threads/  at e15474b, every process with torch's default threads (2 here)
#   threads-auto/           at 06731a1, tensorwire-worker --threads auto and DDP's processes
#                           alike: the usable cores divided among the workers (1 here)
set -u
here=docs/bench-ddp-2026-12-05/${1:?usage: sh run.sh DIR}
mkdir -p "$here"
py=.venv/bin/python
run() {
    name=$1; shift
    $py -m tensorwire.bench ps --ddp --repeat 3 --transports shm,tcp,grpc "$@" \
        --json "$here/$name.json" > "$here/$name.txt" 2>&1
    echo "exit $?" >> "$here/$name.txt"
}
run digits --model digits --framework torch --steps 300
run cnn --model examples/torch_digits.py:make --steps 200
run many --model many --framework torch --steps 60
run large --model large --framework torch --steps 30
