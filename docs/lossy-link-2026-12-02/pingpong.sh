#!/bin/sh
# pingpong.py through the link of test_netns.py -k slow_link (tbf, 4 Mbit/s, a 12 KB queue, at
# both ends) between two namespaces, with BBR (this VM's default) and with reno: 150 round trips
# of 40 KB, about what a digits step moves each way. As root.
here=$(cd "$(dirname "$0")" && pwd)
trap "ip netns del lxa 2>/dev/null; ip netns del lxb 2>/dev/null" EXIT
ip netns add lxa; ip netns add lxb
ip -n lxa link set lo up; ip -n lxb link set lo up
ip link add lxva type veth peer name lxvb
ip link set lxva netns lxa; ip link set lxvb netns lxb
ip -n lxa addr add 10.239.0.1/24 dev lxva; ip -n lxb addr add 10.239.0.2/24 dev lxvb
ip -n lxa link set lxva up; ip -n lxb link set lxvb up
ip netns exec lxa tc qdisc add dev lxva root tbf rate 4mbit burst 8kb limit 12kb
ip netns exec lxb tc qdisc add dev lxvb root tbf rate 4mbit burst 8kb limit 12kb
for cc in bbr reno; do
  ip netns exec lxa sysctl -qw net.ipv4.tcp_congestion_control=$cc
  ip netns exec lxb sysctl -qw net.ipv4.tcp_congestion_control=$cc
  for mode in one two two-credit; do
    ip netns exec lxb python3 "$here/pingpong.py" server $mode 10.239.0.2 40000 150 10.239.0.1 &
    sleep 0.3
    printf '%s ' $cc
    ip netns exec lxa python3 "$here/pingpong.py" client $mode 10.239.0.2 40000 150
    wait
  done
done
