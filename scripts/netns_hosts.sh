# Hosts made of network namespaces on this machine, for multi-host runs without a cluster (source it;
# needs iproute2 and util-linux's unshare). `netns_hosts_up NAME N` makes N namespaces NAME-0 ..
# NAME-(N-1), each with loopback and an `eth0` at 10.213.0.(i+1)/24, all cabled by veth pairs to a
# bridge in a namespace NAME-switch: a LAN of N hosts whose addresses exist only inside those
# namespaces. `netns_hosts_down NAME` removes them (deleting a namespace deletes its veth ends and the
# bridge). Run a command on host i with `ip netns exec NAME-i COMMAND`; its `eth0` byte counters count
# what that host put on the wire.
#
# A script first calls `netns_hosts_isolate "$0" "$@"`: it runs again inside a user, network and mount
# namespace of its own, where it is root without being root (unprivileged user namespaces, on by
# default in Debian), so it needs no root and nothing it makes is seen outside or outlives it.

netns_hosts_isolate() {
  if [[ -n ${KUAFU_NETNS_ISOLATED:-} ]]; then
    mount -t tmpfs kuafu-netns /run && mkdir -p /run/netns  # `ip netns` keeps its names there
    ip link set lo up  # for what the script runs on the machine itself (one-host runs over loopback)
    return
  fi
  if ! unshare --user --map-root-user --net --mount true 2>/tmp/netns_hosts.$$; then
    echo "netns_hosts: cannot make a user, network and mount namespace ($(cat /tmp/netns_hosts.$$)): this needs" \
      "unprivileged user namespaces (sysctl user.max_user_namespaces > 0) or root" >&2
    rm -f /tmp/netns_hosts.$$
    exit 1
  fi
  rm -f /tmp/netns_hosts.$$
  KUAFU_NETNS_ISOLATED=1 exec unshare --user --map-root-user --net --mount --propagation private bash "$@"
}

netns_hosts_address() { echo "10.213.0.$(($1 + 1))"; }  # host index -> its address

netns_hosts_down() {
  local name=$1 ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-([0-9]+|switch)\$"); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns delete "$ns"
  done
}

netns_hosts_up() {
  local name=$1 hosts=$2 i
  if ! ip netns add "$name-switch" 2>/tmp/netns_hosts.$$; then
    echo "netns_hosts: cannot create network namespaces ($(cat /tmp/netns_hosts.$$)): call" \
      "netns_hosts_isolate first, or run as root" >&2
    rm -f /tmp/netns_hosts.$$
    return 1
  fi
  rm -f /tmp/netns_hosts.$$
  ip -n "$name-switch" link add br0 type bridge &&
    ip -n "$name-switch" link set br0 up || return 1
  for ((i = 0; i < hosts; i++)); do
    # Both ends are created inside the namespaces, so no name in this host's own namespace is touched.
    ip netns add "$name-$i" &&
      ip link add eth0 netns "$name-$i" type veth peer name "h$i" netns "$name-switch" &&
      ip -n "$name-switch" link set "h$i" master br0 &&
      ip -n "$name-switch" link set "h$i" up &&
      ip -n "$name-$i" addr add "$(netns_hosts_address "$i")/24" dev eth0 &&
      ip -n "$name-$i" link set eth0 up &&
      ip -n "$name-$i" link set lo up || return 1
  done  # (the bridge has no STP: its ports forward as soon as they are up)
}

# Bytes and packets interface eth0 of host NAME-i has transmitted so far: "BYTES PACKETS".
netns_hosts_tx() {
  ip netns exec "$1-$2" cat /sys/class/net/eth0/statistics/tx_bytes /sys/class/net/eth0/statistics/tx_packets | paste -sd' '
}
