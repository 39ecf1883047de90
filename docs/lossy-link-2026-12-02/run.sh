#!/bin/sh
# A bsp job of 200 steps (one server, two workers, each in a network namespace of its own)
# with worker 1 behind a 4 Mbit/s link of a 12 KB queue that drops what overflows it (tbf), over
# tcp, grpc-stream and nixl (UCX on TCP): the CI test (40 steps) run longer. As root.
cd "$(dirname "$0")/../.." || exit 1
TW_SLOW_LINK_STEPS=200 .venv/bin/python -m pytest -q -s -p no:cacheprovider \
  tests/test_netns.py -k slow_link 2>&1 | tee docs/lossy-link-2026-12-02/run-200-steps.txt
