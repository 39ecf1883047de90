#!/bin/sh
# The cost of --clip-grad-norm under asp (each worker takes the squared norm of its whole
# gradient and sends it in its meta; a server holds the push's gradients in their slots until
# that meta lands, then steps them): asp jobs without it and with `--clip-grad-norm 1e30`
# (the norm taken and the wait for the meta every push, but never a clip, so that both jobs
# compute the same numbers), in turn, three rounds, on the small digits MLP and the 25 MB
# `large` model, 2 servers and 2 workers. Writes each job's table and JSON, then pairs.txt.
# Run from the repository root:   sh docs/clip-async-2026-12-05/measure.sh
set -e
out=docs/clip-async-2026-12-05${SUFFIX:+/$SUFFIX}  # (SUFFIX: a folder of its own for a rerun)
mkdir -p "$out"
for round in 1 2 3; do
  for model in digits large; do
    steps=1000; [ "$model" = large ] && steps=30
    for clip in none 1e30; do
      args="--optimizer momentum --lr 0.05"
      [ "$clip" != none ] && args="$args --clip-grad-norm $clip"
      .venv/bin/tensorwire bench --no-progress ps --sync asp --servers 2 --workers 2 \
        --model "$model" --steps "$steps" --repeat 2 --transports shm,tcp,grpc \
        --ps-args "$args" --json "$out/r$round-$model-clip-$clip.json" \
        > "$out/r$round-$model-clip-$clip.txt"
    done
  done
done
.venv/bin/python - "$out" > "$out/pairs.txt" <<'PY'
import json, sys
out = sys.argv[1]
print("round  model transport   steps/s   steps/s  change  comm ms  comm ms")
print("                           plain      clip            plain     clip")
for r in (1, 2, 3):
    for model in ("digits", "large"):
        plain, clip = (
            {row["transport"]: row for row in json.load(open(f"{out}/r{r}-{model}-clip-{c}.json"))["rows"]}
            for c in ("none", "1e30")
        )
        for t in plain:
            a, b = plain[t], clip[t]
            change = 100 * (b["steps_per_s"] / a["steps_per_s"] - 1)
            print(
                f"{r:5d} {model:>6s} {t:>9s} {a['steps_per_s']:9.2f} {b['steps_per_s']:9.2f} "
                f"{change:+6.1f}% {a['communication_ms']:8.1f} {b['communication_ms']:8.1f}"
            )
PY
