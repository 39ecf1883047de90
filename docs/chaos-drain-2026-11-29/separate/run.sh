#!/bin/sh
# Run from the repository root with the venv active, as root (--hosts separate); run at e0b859b.
events=drain-worker,kill-server,kill-worker,freeze-worker,stop-worker,freeze-server
for spec in "tcp bsp 8000 5101" "tcp asp 8000 5102" "nixl ssp 6000 5103" "grpc-stream asp 2000 5104" "tcp ssp 8000 5105"; do
  set -- $spec
  python -m tensorwire.bench chaos --transport "$1" --sync "$2" --steps "$3" --hosts separate --events "$events" \
     --duration 400 --gap 0.3 --stall 60 --seed "$4" --no-progress --json docs/chaos-drain-2026-11-29/separate/$1-$2-$4.json > docs/chaos-drain-2026-11-29/separate/$1-$2-$4.txt 2>&1
  echo "$1 $2 seed $4: exit $? $(tail -n 1 docs/chaos-drain-2026-11-29/separate/$1-$2-$4.txt)"
done > docs/chaos-drain-2026-11-29/separate/summary.txt
