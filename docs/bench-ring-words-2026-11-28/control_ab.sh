#!/bin/sh
# The control-plane probes against two checkouts, alternated, each run from /tmp with the
# checkout on PYTHONPATH: sh control_ab.sh OLD_DIR NEW_DIR PYTHON ROUNDS (the output of
# 089b563 against 64aa382 is probes-control.txt beside this script).
set -e
old=$1 new=$2 python=$3 rounds=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
cd /tmp
for probe in tick_cost first_write control_round_trip; do
    i=0
    while [ "$i" -lt "$rounds" ]; do
        for side in old new; do
            if [ "$side" = old ]; then dir=$old; else dir=$new; fi
            echo "$ $side ($(git -C "$dir" rev-parse --short HEAD)): python $probe.py"
            PYTHONPATH=$dir "$python" "$here/$probe.py"
        done
        i=$((i + 1))
    done
done
