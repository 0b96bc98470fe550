#!/usr/bin/env bash
# kuafu-fold predict's peak memory (max resident set, /usr/bin/time) against the sequence's length, whole and
# chunked (data.chunk_size), at AlphaFold 2's widths (c_m 256, c_z 128; Evoformer blocks run one after the
# other without gradient, so two blocks show a block's peak) on a random sequence alone (one MSA row), one
# iteration, the initial weights. One JSON line per (length, chunk, DAP size). Under DAP n (n ranks of
# kuafu-run, one thread each, else 2 threads) the figure is the largest rank's peak: each holds 1/n of the
# MSA and pair activations.
# Usage: benchmarks/fold_predict_memory.sh [build dir = build]   (LENGTHS="128 256 512", CHUNKS="0 64", DAP="1", BLOCKS=2)
set -euo pipefail
build=${1:-build}
fold="$build/apps/fastfold/kuafu-fold"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '[model]\nevoformer_blocks = %s\nextra_msa_blocks = 1\n[data]\nmax_recycles = 0\n' "${BLOCKS:-2}" > "$work/config.toml"
for n in ${LENGTHS:-128 256 512}; do
  python3 -c "import random; random.seed($n); print('>random'); print(''.join(random.choice('ACDEFGHIKLMNPQRSTVWY') for _ in range($n)))" > "$work/q.fasta"
  for chunk in ${CHUNKS:-0 64}; do
    for dap in ${DAP:-1}; do
      rm -f "$work/q.pdb"
      launch=("$fold") threads=2
      if (( dap > 1 )); then launch=("$build/tools/kuafu-run" --nproc-per-node "$dap" "$fold") threads=1; fi
      start=$(date +%s.%N)
      # GNU time's peak covers the launcher's ranks (Linux reports the largest waited-for descendant's).
      /usr/bin/time -f '%M' -o "$work/rss" "${launch[@]}" predict --config "$work/config.toml" --set "data.chunk_size=$chunk" \
        --set "parallel.dap.size=$dap" --set runtime.threads=$threads --fasta "$work/q.fasta" --out "$work/q.pdb" \
        --checkpoint init > /dev/null 2>&1
      seconds=$(python3 -c "import time; print(round(time.time() - $start, 1))")
      echo "{\"residues\": $n, \"chunk_size\": $chunk, \"dap\": $dap, \"peak_rss_mb\": $(( $(cat "$work/rss") / 1024 )), \"seconds\": $seconds}"
    done
  done
done
