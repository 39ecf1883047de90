#!/bin/sh
# The runs of README.md in this folder, one after the other, on the project's 2-core VM with
# nothing else running (from the repository's root, the venv's python first on PATH).
set -x
D=docs/bench-ps-many-workers-2026-12-02
python -m tensorwire.bench ps --workers 16 --servers 2 --model digits --steps 100 \
    --transports shm,tcp,nixl,grpc,grpc-stream --json $D/w16.json > $D/w16.txt 2>&1
python -m tensorwire.bench ps --workers 64 --servers 2 --model digits --batch 16 --steps 50 \
    --transports shm,tcp,nixl,grpc --json $D/w64.json > $D/w64-nixl-failed-2.txt 2>&1
python $D/add_peer.py > $D/add_peer.txt 2>&1
python $D/idle_receiver.py > $D/idle_receiver.txt 2>&1
python -m tensorwire.bench ps --workers 64 --servers 2 --model digits --batch 16 --steps 50 \
    --transports shm,tcp,grpc --json $D/w64.json > $D/w64.txt 2>&1
python -m tensorwire.bench ps --workers 64 --servers 2 --model digits --batch 16 --steps 50 \
    --transports nixl --json $D/w64-nixl.json > $D/w64-nixl-failed-3.txt 2>&1
# Later the same day (the second part of README.md), at f3659a8 and 25cfa4b:
git worktree add /tmp/old f3659a8~1
python $D/add_peers_at.py /tmp/old > $D/add_peers-before.txt 2>&1
python $D/add_peers.py > $D/add_peers.txt 2>&1
python $D/servers_last.py > $D/servers_last.txt 2>&1
