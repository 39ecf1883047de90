#!/bin/sh
# The cost of --clip-grad-norm over two shards (the workers add up the servers' squared norms:
# a round trip more each step): bsp jobs of 2 servers and 2 workers without it and with
# `--clip-grad-norm 1e30` (the round every step, but never a clip), in turn, three rounds, on
# the small digits MLP (the step's round trips are most of its time) and the 25 MB `large`
# model (bench/clip_cost.sh; until 2026-12-05 the same loop written here, and pairs.txt made
# by hand: its changes are within 0.2 points of those the script computes from the JSON).
# Run from the repository root:
#   sh docs/clip-shards-2026-12-05/measure.sh   (SUFFIX=name: into a folder of that name)
set -e
. bench/clip_cost.sh  # measure OUT FLAGS...
measure "docs/clip-shards-2026-12-05${SUFFIX:+/$SUFFIX}"
