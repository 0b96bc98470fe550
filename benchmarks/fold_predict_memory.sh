#!/usr/bin/env bash
# kuafu-fold predict's peak memory (max resident set, /usr/bin/time) against the sequence's length, whole and
# chunked (data.chunk_size), at AlphaFold 2's widths (c_m 256, c_z 128; Evoformer blocks run one after the
# other without gradient, so two blocks show a block's peak) on a random sequence alone (one MSA row), one
# iteration, the initial weights. One JSON line per (length, chunk).
# Usage: benchmarks/fold_predict_memory.sh [build dir = build]   (LENGTHS="128 256 512", CHUNKS="0 64", BLOCKS=2)
set -euo pipefail
build=${1:-build}
fold="$build/apps/fastfold/kuafu-fold"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '[model]\nevoformer_blocks = %s\nextra_msa_blocks = 1\n[data]\nmax_recycles = 0\n' "${BLOCKS:-2}" > "$work/config.toml"
for n in ${LENGTHS:-128 256 512}; do
  python3 -c "import random; random.seed($n); print('>random'); print(''.join(random.choice('ACDEFGHIKLMNPQRSTVWY') for _ in range($n)))" > "$work/q.fasta"
  for chunk in ${CHUNKS:-0 64}; do
    rm -f "$work/q.pdb"
    start=$(date +%s.%N)
    /usr/bin/time -f '%M' -o "$work/rss" "$fold" predict --config "$work/config.toml" --set "data.chunk_size=$chunk" \
      --set runtime.threads=2 --fasta "$work/q.fasta" --out "$work/q.pdb" --checkpoint init > /dev/null 2>&1
    seconds=$(python3 -c "import time; print(round(time.time() - $start, 1))")
    echo "{\"residues\": $n, \"chunk_size\": $chunk, \"peak_rss_mb\": $(( $(cat "$work/rss") / 1024 )), \"seconds\": $seconds}"
  done
done
