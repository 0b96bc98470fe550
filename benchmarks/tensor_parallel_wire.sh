#!/usr/bin/env bash
# What each rank really sends for one GPT block under 1D, 2D, 2.5D and 3D: every rank on its own host
# (a network namespace of scripts/netns_hosts.sh, cabled to a bridge), started by its own
# `kuafu-run --nnodes P --node-rank i`, and its eth0 transmit counters read around the block
# (benchmarks/tensor_parallel_comm --interface eth0), next to the bytes docs/tensor_parallel.md
# accounts, in namespaces of its own (no root needed: scripts/netns_hosts.sh). JSON lines into OUT (one per layout); extra arguments (e.g. --hidden 256
# --batch 4 --seq 64) go to every run.
# usage: benchmarks/tensor_parallel_wire.sh [build dir = build] [OUT = runs/tensor_parallel_wire.jsonl]
#          [LAYOUTS="1d 4 1;2d 4 1;1d 8 1;2.5d 8 2;3d 8 1"] [options...]
#   A layout is "MODE RANKS DEPTH", or "COLLECTIVE RANKS" for one collective of N x H floats
#   (all_reduce, all_gather, reduce_scatter, broadcast, reduce).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../scripts/netns_hosts.sh"
netns_hosts_isolate "$0" "$@"
build=${1:-build}
out=${2:-runs/tensor_parallel_wire.jsonl}
shift 2 || shift $#
bench=$(realpath "$build/benchmarks/tensor_parallel_comm")
run=$(realpath "$build/tools/kuafu-run")
for tool in "$bench" "$run"; do
  [[ -x $tool ]] || { echo "$tool not found: build first (cmake --build $build -j2)" >&2; exit 1; }
done
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
name=kuafu-wire-$$
trap 'netns_hosts_down $name' EXIT
netns_hosts_up "$name" 8 || exit 1
mkdir -p "$(dirname "$out")"
logs=$(mktemp -d)
status=0
port=29600
IFS=';' read -ra layouts <<<"${LAYOUTS:-1d 4 1;2d 4 1;1d 8 1;2.5d 8 2;3d 8 1}"
for layout in "${layouts[@]}"; do
  read -r mode ranks depth <<<"$layout"
  case $mode in
    1d | 2d | 2.5d | 3d) what=(--mode "$mode" --depth "$depth") ;;
    *) what=(--collective "$mode") ;;
  esac
  port=$((port + 1))
  pids=()
  for ((i = 0; i < ranks; i++)); do
    ip netns exec "$name-$i" "$run" --nnodes "$ranks" --node-rank "$i" --nproc-per-node 1 \
      --master-addr "$(netns_hosts_address 0)" --master-port "$port" \
      "$bench" "${what[@]}" --interface eth0 "$@" >"$logs/$i.out" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < ranks; i++)); do
    wait "${pids[$i]}" || { echo "$mode P=$ranks: host $i failed:" >&2; tail -5 "$logs/$i.out" >&2; status=1; }
  done
  grep -v '^{' "$logs/0.out" | grep -v '^kuafu-run'
  grep '^{' "$logs/0.out" >>"$out"
done
rm -rf "$logs"
exit $status
