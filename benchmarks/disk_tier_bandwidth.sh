#!/usr/bin/env bash
# The disk tier's bandwidth against the disk's own (issue 55): `dd` with O_DIRECT (bs 8 MiB, as the tier's
# calls) writing and reading the same bytes on the same folder, then disk_tier_bandwidth with O_DIRECT at 1,
# 2 and 4 I/O threads, ROUNDS times in turn; one JSON line each.
# Usage: benchmarks/disk_tier_bandwidth.sh [build dir = build] [folder = /tmp]   (CHUNKS=32, CHUNK_MIB=64, ROUNDS=2)
set -euo pipefail
build=${1:-build}
dir=${2:-/tmp}
chunks=${CHUNKS:-32} mib=${CHUNK_MIB:-64}
count=$(( chunks * mib / 8 ))
file="$dir/kuafu-dd-probe.$$"
trap 'rm -f "$file"' EXIT
for ((round = 0; round < ${ROUNDS:-2}; round++)); do
  for way in write read; do
    if [ $way = write ]; then
      out=$(dd if=/dev/zero of="$file" bs=8M count="$count" oflag=direct 2>&1 | tail -1)
    else
      out=$(dd if="$file" of=/dev/null bs=8M iflag=direct 2>&1 | tail -1)
    fi
    seconds=$(echo "$out" | sed -E 's/.* copied, ([0-9.]+) s.*/\1/')
    python3 -c "import json; print(json.dumps({'impl': 'dd', 'way': '$way', 'direct': True, 'gb': $count * 8 * 2**20 / 1e9, 'seconds': $seconds, 'gb_per_s': $count * 8 * 2**20 / 1e9 / $seconds}))"
  done
  rm -f "$file"
  for threads in 1 2 4; do
    "$build/benchmarks/disk_tier_bandwidth" --dir "$dir" --chunks "$chunks" --chunk-mib "$mib" --threads "$threads"
  done
done
