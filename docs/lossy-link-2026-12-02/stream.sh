#!/bin/sh
# The link of test_netns.py -k slow_link alone: 2 MB over one TCP connection between two namespaces
# through tbf (4 Mbit/s, a 12 KB queue) at both ends; tc then counts what it dropped. As root.
set -e
trap "ip netns del lxa 2>/dev/null; ip netns del lxb 2>/dev/null" EXIT
ip netns add lxa; ip netns add lxb
ip -n lxa link set lo up; ip -n lxb link set lo up
ip link add lxva type veth peer name lxvb
ip link set lxva netns lxa; ip link set lxvb netns lxb
ip -n lxa addr add 10.239.0.1/24 dev lxva; ip -n lxb addr add 10.239.0.2/24 dev lxvb
ip -n lxa link set lxva up; ip -n lxb link set lxvb up
for p in "lxa lxva" "lxb lxvb"; do set -- $p; ip netns exec $1 tc qdisc add dev $2 root tbf rate 4mbit burst 8kb limit 12kb; done
ip netns exec lxb python3 -c '
import socket
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR,1); s.bind(("10.239.0.2",5999)); s.listen()
c,_=s.accept(); n=0
while (d:=c.recv(65536)): n+=len(d)
print("got",n)' &
sleep 0.5
ip netns exec lxa python3 -c '
import socket,time
t=time.time(); s=socket.create_connection(("10.239.0.2",5999)); s.sendall(b"x"*2_000_000); s.close(); print("sent in", time.time()-t)'
wait
ip netns exec lxa tc -s qdisc show dev lxva; ip netns exec lxb tc -s qdisc show dev lxvb
