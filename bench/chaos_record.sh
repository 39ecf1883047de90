# Sourced by the run.sh of a docs/chaos-* folder (from the repository's root, as root where
# cut-connections or --hosts separate are among the faults): `run NAME ARGS...` runs `bench
# chaos ARGS` with every fault kind it makes and records NAME.txt (its table, then its exit
# code) and NAME.json (the whole run) in $here, which the script sets first. PYTHON: the
# interpreter (default the project's .venv).
all=kill-worker,freeze-worker,stop-worker,drain-worker,kill-server,move-server,freeze-server,cut-connections
python=${PYTHON:-.venv/bin/python}
run() {
    name=$1; shift
    $python -m tensorwire.bench chaos "$@" --events "$all" --json "$here/$name.json" \
        > "$here/$name.txt" 2>&1
    echo "exit $?" >> "$here/$name.txt"
}
