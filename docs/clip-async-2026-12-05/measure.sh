#!/bin/sh
# The cost of --clip-grad-norm under asp (each worker takes the squared norm of its whole
# gradient and sends it in its meta; a server holds the push's gradients in their slots until
# that meta lands, then steps them): asp jobs of 2 servers and 2 workers without it and with
# `--clip-grad-norm 1e30`, in turn, three rounds (bench/clip_cost.sh). Run from the repository
# root:   sh docs/clip-async-2026-12-05/measure.sh   (SUFFIX=name: into a folder of that name)
set -e
. bench/clip_cost.sh  # measure OUT FLAGS...
measure "docs/clip-async-2026-12-05${SUFFIX:+/$SUFFIX}" --sync asp
