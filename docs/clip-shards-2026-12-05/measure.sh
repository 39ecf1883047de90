#!/bin/sh
# The cost of --clip-grad-norm over two shards (the workers add up the servers' squared norms:
# a round trip more each step): jobs without it and with `--clip-grad-norm 1e30` (the round
# every step, but never a clip, so that both jobs compute the same numbers: a clip changes the
# training, and the `large` model's arithmetic slowed by half in the jobs it did not clip),
# in turn, three rounds, on the small digits MLP (the step's round trips are most of its time)
# and the 25 MB `large` model. Run from the repository root:
#   sh docs/clip-shards-2026-12-05/measure.sh   (SUFFIX=name: into a folder of that name)
set -e
out=docs/clip-shards-2026-12-05${SUFFIX:+/$SUFFIX}  # (SUFFIX: a folder of its own for a rerun)
mkdir -p "$out"
for round in 1 2 3; do
  for model in digits large; do
    steps=1000; [ "$model" = large ] && steps=30
    for clip in none 1e30; do
      args="--optimizer momentum --lr 0.05"
      [ "$clip" != none ] && args="$args --clip-grad-norm $clip"
      .venv/bin/tensorwire bench --no-progress ps --servers 2 --workers 2 --model "$model" \
        --steps "$steps" --repeat 2 --transports shm,tcp,grpc --ps-args "$args" \
        --json "$out/r$round-$model-clip-$clip.json" > "$out/r$round-$model-clip-$clip.txt"
    done
  done
done
