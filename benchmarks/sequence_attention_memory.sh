#!/usr/bin/env bash
# Peak memory per rank of one attention layer (forward + backward) under sequence parallelism, one
# fresh set of processes per point: (1) at growing sequence length for P = 1, 2, 4 and each mode;
# (2) the longest sequence that fits a per-rank budget (bisection to a step of 32 x P positions).
# Usage: benchmarks/sequence_attention_memory.sh [build dir = build] [budget MiB = 32]
set -euo pipefail
build=${1:-build}
budget=${2:-32}
bench="$build/benchmarks/sequence_attention_memory"
run="$build/tools/kuafu-run"
for tool in "$bench" "$run"; do
  [[ -x $tool ]] || { echo "$tool not found: build first (cmake --build $build -j2)" >&2; exit 1; }
done
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export MALLOC_MMAP_THRESHOLD_=65536  # large blocks are mapped and unmapped, so resident = live

# peak MiB per rank of one run: mode ranks seq
peak() {
  "$run" --nproc-per-node "$2" "$bench" --mode "$1" --seq "$3" |
    sed -n 's/.*"peak_mib_per_rank":\([0-9.e+-]*\).*/\1/p'
}

echo "## Peak MiB per rank, one causal attention layer (8 heads x 64, batch 1), forward + backward"
echo "| mode | n | P = 1 | P = 2 | P = 4 |"
echo "|---|---|---|---|---|"
for mode in ring ring_scores all_to_all; do
  for n in 1024 2048 4096 8192; do
    [[ $mode == ring_scores && $n -gt 4096 ]] && continue  # n^2 scores: 2 GiB a tensor at n = 8192
    row="| $mode | $n |"
    for ranks in 1 2 4; do row="$row $(printf '%.1f' "$(peak "$mode" "$ranks" "$n")") |"; done
    echo "$row"
  done
done

echo
echo "## Longest sequence within $budget MiB per rank"
echo "| mode | P = 1 | P = 2 | P = 4 |"
echo "|---|---|---|---|"
for mode in ring ring_scores; do
  row="| $mode |"
  for ranks in 1 2 4; do
    step=$((32 * ranks))
    fits=0
    n=$step
    # Double while it fits, then bisect between the last fit and the first miss.
    while awk "BEGIN{exit !($(peak "$mode" "$ranks" "$n") <= $budget)}"; do fits=$n; n=$((n * 2)); done
    misses=$n
    while ((misses - fits > step)); do
      mid=$(((fits + misses) / 2 / step * step))
      if awk "BEGIN{exit !($(peak "$mode" "$ranks" "$mid") <= $budget)}"; then fits=$mid; else misses=$mid; fi
    done
    row="$row $fits |"
  done
  echo "$row"
done
