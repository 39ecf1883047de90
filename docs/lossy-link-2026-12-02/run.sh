#!/bin/sh
# test_netns.py -k slow_link run longer: a bsp job (one server, two workers, each in a network
# namespace of its own) with worker 1 behind a 4 Mbit/s link of a 12 KB queue that drops what
# overflows it (tbf), over tcp, grpc-stream and nixl (UCX on TCP). 200 steps with BBR (the
# test's congestion control, this VM's default), then 150 over tcp and nixl with reno, which
# backs off at loss. As root.
cd "$(dirname "$0")/../.." || exit 1
out=docs/lossy-link-2026-12-02
git rev-parse --short HEAD > $out/commit.txt
TW_SLOW_LINK_STEPS=200 .venv/bin/python -m pytest -q -s -p no:cacheprovider \
  tests/test_netns.py -k slow_link 2>&1 | tee $out/run-200-steps-bbr.txt
TW_SLOW_LINK_STEPS=150 TW_SLOW_LINK_CC=reno .venv/bin/python -m pytest -q -s -p no:cacheprovider \
  tests/test_netns.py -k "slow_link and (tcp or nixl)" 2>&1 | tee $out/run-150-steps-reno.txt
