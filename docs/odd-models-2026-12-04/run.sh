#!/bin/bash
# run.sh: each factory of factories.py through `tensorwire demo` (one server, two workers, shm),
# then api_probe.py; the last lines of each go to stdout
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
for f in sparse lazy dict_output running_out; do
  echo "== $f"
  PYTHONPATH=$HERE "$ROOT/.venv/bin/tensorwire" demo --model "$HERE/factories.py:$f" --steps 40 \
    --transports shm --quiet 2>&1 | tail -n 3
done
echo "== api_probe.py"
"$ROOT/.venv/bin/python" "$HERE/api_probe.py"
