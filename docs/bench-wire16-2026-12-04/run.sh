#!/bin/sh
# The float16 wire before (HEAD~1's server and worker: numpy's casts) and after 45dab86
# (tensorwire.job.wire16), in turn, twice; bfloat16 and float32 beside them as references.
# Run from the project root at 45dab86; each job's table and JSON here.
set -u
here=docs/bench-wire16-2026-12-04
py=${PYTHON:-.venv/bin/python}
job() {  # NAME PS-ARGS
    $py -m tensorwire.bench ps --model many --transports shm,tcp --steps 60 \
        --ps-args "$2" --json "$here/$1.json" > "$here/$1.txt" 2>&1
}
for round in 1 2; do
    git checkout -q 45dab86~1 -- client/psclient.py server/ps.py
    job "float16-before-r$round" "--wire-dtype float16"
    git checkout -q 45dab86 -- client/psclient.py server/ps.py
    job "float16-after-r$round" "--wire-dtype float16"
    job "bfloat16-r$round" "--wire-dtype bfloat16"
    job "float32-r$round" "--wire-dtype float32"
done
grep -H -E "^ +(shm|tcp) " $here/*.txt
# The `large` model (25.3 MB) at 45dab86's successor, each wire dtype once, 30 steps:
for wd in float16 bfloat16 float32; do
    $py -m tensorwire.bench ps --model large --transports shm,tcp --steps 30 \
        --ps-args "--wire-dtype $wd" --json "$here/large-$wd.json" > "$here/large-$wd.txt" 2>&1
done
