#!/bin/sh
# tensorwire's transports against torch.distributed's gloo send/recv (bench --gloo), on the
# project's 2-core VM at e34f60e, from the repository's root, one command after the other.
set -u
here=docs/bench-gloo-2026-12-05
py=.venv/bin/python
# the default receiver memory (/dev/shm), twice
for i in 1 2; do
    $py -m tensorwire.bench --transports shm,tcp,grpc-stream --gloo --repeat 5 --no-progress \
        --json $here/run$i.json --markdown $here/run$i.md
done
# 1 and 16 MiB, ten rounds, tcp alone: the receiver's slots in /dev/shm, then in private memory
# (as for senders on other hosts: tw.Receiver(shm=False), the daemons' --no-shm)
$py -m tensorwire.bench --sizes 1M,16M --transports tcp --gloo --repeat 10 --round-trips 50 \
    --no-progress --markdown $here/focus-shared.md
$py -m tensorwire.bench --sizes 1M,16M,64M --transports tcp --gloo --repeat 10 --round-trips 50 \
    --receiver-memory private --no-progress --markdown $here/focus-private.md
# every size in private memory, with nixl (UCX over cma on one host: no RDMA NIC here)
$py -m tensorwire.bench --transports tcp,nixl --gloo --repeat 5 --receiver-memory private \
    --no-progress --json $here/private.json --markdown $here/private.md
