#!/bin/bash
# A/B: the server stepping packs whole (HEAD) against each member alone (655d17a's server), in turn.
cd /work/main
D=docs/bench-packs-2026-12-04/flat-steps
mkdir -p $D
B=".venv/bin/python -m tensorwire.bench ps"
for round in 1 2; do
  for side in alone whole; do
    if [ $side = alone ]; then git checkout 655d17a -- server/ps.py server/optim.py; else git checkout HEAD -- server/ps.py server/optim.py; fi
    for opt in sgd adam; do
      $B --model many --transports shm,tcp,nixl --repeat 2 --steps 60 --ps-args "--optimizer $opt" --json $D/$opt-$side-r$round.json > $D/$opt-$side-r$round.txt 2>&1
    done
  done
done
git checkout HEAD -- server/ps.py server/optim.py
git status --short
echo done > $D/.finished
