#!/bin/bash
# A/B of --pack-bytes 0 against the default (262144), alternated, two rounds, per model.
cd /work/main
D=docs/bench-packs-2026-12-04
mkdir -p $D
B=".venv/bin/python -m tensorwire.bench ps"
for round in 1 2; do
  for pb in 0 262144; do
    $B --model many --transports shm,tcp,nixl,grpc,grpc-stream --repeat 3 --steps 60 --ps-args "--pack-bytes $pb" --json $D/many-$pb-r$round.json > $D/many-$pb-r$round.txt 2>&1
    $B --model digits --transports shm,tcp,nixl,grpc,grpc-stream --repeat 3 --steps 200 --ps-args "--pack-bytes $pb" --json $D/digits-$pb-r$round.json > $D/digits-$pb-r$round.txt 2>&1
    $B --model examples/torch_digits.py:make --transports shm,tcp,grpc --repeat 3 --steps 60 --ps-args "--pack-bytes $pb" --json $D/torchcnn-$pb-r$round.json > $D/torchcnn-$pb-r$round.txt 2>&1
  done
done
echo done > $D/.finished
