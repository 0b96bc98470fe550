#!/usr/bin/env bash
# Two hosts made of network namespaces (scripts/netns_hosts.sh): a GPT job of 2 data x 2 tensor (1D)
# ranks, dropout on, started by `kuafu-run --nnodes 2 --node-rank i` on each host and rendezvousing at
# host 0's veth address, must end with the same weights, optimizer state, RNG states and losses, bit
# for bit, as the same job on one host (4 ranks over loopback). The tensor groups stay inside a host;
# the data groups cross the veth, whose transmit counter must hold what the trainer accounts for them.
# Then a fault while connecting: every rank advertises loopback (GLOO_SOCKET_IFNAME=lo), so the side
# that connects is refused and fails, and the side that waits to be connected (Gloo waits for ever)
# must still exit non-zero within dist.timeout_s (5 s) + 10 s, naming the group (one rank per host).
# Fails (never skips) where namespaces cannot be made.
# usage: two_hosts_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
source "$1/scripts/netns_hosts.sh"
netns_hosts_isolate "$0" "$@"
src=$1
build=$2
work=$3
source "$src/tests/dist/two_hosts_common.sh"
make_job 4 4
run_one_host "$work/one_host"

read -r before _ <<<"$(netns_hosts_tx "$hosts" 1)"
start_two_hosts "$work/two_hosts" 29400
for host in 0 1; do
  wait "${two_host_pids[$host]}" || { tail -20 "$work/two_hosts.host$host.log"; fail "host $host of the two-host job"; }
done
read -r after _ <<<"$(netns_hosts_tx "$hosts" 1)"

step=$work/one_host/checkpoints/step_00000004
# Every rank's pieces of the model and optimizer state, and its RNG state.
files=$(cd "$step" && ls *.safetensors)
for kind in model optimizer rng; do
  [[ $(echo "$files" | grep -c "^$kind.*rank") == 4 ]] || fail "expected a $kind file of each of the 4 ranks: $(echo $files)"
done
for file in $files; do
  cmp "$step/$file" "$work/two_hosts/checkpoints/step_00000004/$file" || fail "$file differs between one host and two"
done
echo "weights, optimizer state and RNG states: equal bit for bit"
[[ $(losses "$work/one_host") == $(losses "$work/two_hosts") && $(losses "$work/one_host" | wc -l) == 4 ]] ||
  fail "the losses differ: $(losses "$work/one_host") against $(losses "$work/two_hosts")"
echo "losses equal:" $(losses "$work/two_hosts")

python3 - "$work" "$((after - before))" <<'PY'
import json, sys
work, wire = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(f"{work}/two_hosts/metrics.jsonl") if '"comm_bytes_sent"' in l]
# Host 1's two ranks each send their data group's traffic across the veth (rank 0's accounted bytes; the
# ranks are symmetric). On top: the rendezvous, connecting, TCP/IP headers and acknowledgements.
data = [k for k in rows[0]["comm_bytes_sent"] if k.startswith("data=*")]
assert len(data) == 1 and len(rows) == 4, rows
accounted = 2 * sum(r["comm_bytes_sent"][data[0]] for r in rows)
ratio = wire / accounted
print(f"host 1 sent {wire} bytes over its veth; the trainer accounts {accounted} for its data groups: {ratio:.4f}")
assert 1.0 <= ratio <= 1.15, f"wire/accounted {ratio} is outside [1.0, 1.15]"
PY

# A peer that fails while the group connects: both hosts exit non-zero, within the time-out + 10 s.
start=$SECONDS
# One rank per host: with two, each host would hold a refused rank, and kuafu-run would stop the other.
GLOO_SOCKET_IFNAME=lo RANKS_PER_HOST=1 start_two_hosts "$work/unreachable" 29401 --set dist.timeout_s=5 \
  --set parallel.tensor.size=1 --set parallel.tensor.mode=\"none\"
for host in 0 1; do
  if wait "${two_host_pids[$host]}"; then fail "host $host of the unreachable job exited 0"; else code=$?; fi
  ((code != 124)) || fail "host $host of the unreachable job hung (killed by timeout after 300 s)"
  echo "unreachable peers: host $host exited with $code after $((SECONDS - start)) s"
done
((SECONDS - start <= 5 + 10 + 10)) || fail "the unreachable job took $((SECONDS - start)) s to end (time-out 5 s)"
grep -q "connecting process group 'world'" "$work"/unreachable.host*.log ||
  fail "no rank named the group it could not connect: $(tail -n 3 "$work"/unreachable.host*.log)"
