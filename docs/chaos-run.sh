# Sourced by the chaos run records under docs/ (their run.sh): one `bench chaos` run of a job
# that ends by itself, its output and JSON in DIR, and one line saying how it went.
#   chaos_run DIR TRANSPORT SYNC STEPS SEED EVENTS GAP [MORE FLAGS...]
chaos_run() {
    dir=$1 transport=$2 sync=$3 steps=$4 seed=$5 events=$6 gap=$7
    shift 7
    python -m tensorwire.bench chaos --transport "$transport" --sync "$sync" --steps "$steps" \
        --duration 400 --events "$events" --gap "$gap" --stall 60 --seed "$seed" --no-progress \
        "$@" --json "$dir/$transport-$sync-$seed.json" > "$dir/$transport-$sync-$seed.txt" 2>&1
    echo "$transport $sync steps $steps seed $seed: exit $? $(tail -n 1 "$dir/$transport-$sync-$seed.txt")"
}
