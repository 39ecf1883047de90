# Sourced by the measure.sh of a docs/clip-* folder (from the repository's root): `measure OUT
# FLAGS...` runs `tensorwire bench ps --servers 2 --workers 2 --repeat 2 FLAGS` over shm, tcp
# and grpc without clipping and with `--clip-grad-norm 1e30` (the clipping's work every step,
# but never a clip, so that both jobs compute the same numbers: a clip changes the training,
# and the `large` model's arithmetic slowed by half in jobs it did not clip), in turn, three
# rounds, on the digits MLP (1000 steps) and the 25 MB `large` model (30 steps); each job's
# table and JSON into OUT, then OUT/pairs.txt, the two side by side. PYTHON: the interpreter
# (default the project's .venv).
python=${PYTHON:-.venv/bin/python}
measure() {
  out=$1; shift
  mkdir -p "$out"
  for round in 1 2 3; do
    for model in digits large; do
      steps=1000; [ "$model" = large ] && steps=30
      for clip in none 1e30; do
        args="--optimizer momentum --lr 0.05"
        [ "$clip" != none ] && args="$args --clip-grad-norm $clip"
        $python -m tensorwire.bench --no-progress ps --servers 2 --workers 2 "$@" \
          --model "$model" --steps "$steps" --repeat 2 --transports shm,tcp,grpc \
          --ps-args "$args" --json "$out/r$round-$model-clip-$clip.json" \
          > "$out/r$round-$model-clip-$clip.txt" || return 1
      done
    done
  done
  $python - "$out" > "$out/pairs.txt" <<'PY'
import json
import sys

out = sys.argv[1]
print("round  model transport   steps/s   steps/s  change  comm ms  comm ms")
print("                           plain      clip            plain     clip")
for r in (1, 2, 3):
    for model in ("digits", "large"):
        plain, clip = (
            {row["transport"]: row for row in json.load(open(f"{out}/r{r}-{model}-clip-{c}.json"))["rows"]}
            for c in ("none", "1e30")
        )
        for t, a in plain.items():
            b = clip[t]
            change = 100 * (b["steps_per_s"] / a["steps_per_s"] - 1)
            print(
                f"{r:5d} {model:>6s} {t:>9s} {a['steps_per_s']:9.2f} {b['steps_per_s']:9.2f} "
                f"{change:+6.1f}% {a['communication_ms']:8.1f} {b['communication_ms']:8.1f}"
            )
PY
}
