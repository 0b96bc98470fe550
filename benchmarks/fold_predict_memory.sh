#!/usr/bin/env bash
# kuafu-fold predict's peak memory (max resident set, /usr/bin/time) against the sequence's length, whole and
# chunked (data.chunk_size), at AlphaFold 2's widths (c_m 256, c_z 128; Evoformer blocks run one after the
# other without gradient, so two blocks show a block's peak) on a random sequence alone (one MSA row), one
# iteration, the initial weights; MSA_ROWS > 1 gives it an a3m of that many rows (the query, then random copies
# with a third of their residues changed: the first data.max_msa_clusters rows are clustered, the next
# data.max_extra_msa the extra MSA's). One JSON line per (length, chunk, DAP size). Under DAP n (n ranks of
# kuafu-run, one thread each, else 2 threads) the figure is the largest rank's peak: each holds 1/n of the
# MSA and pair activations.
# PRECISIONS="fp32 bf16" runs each also with the trunk in bf16 (precision.dtype; the structure module and heads in
# float32).
# Usage: benchmarks/fold_predict_memory.sh [build dir = build]   (LENGTHS="128 256 512", CHUNKS="0 64", DAP="1", BLOCKS=2,
#                                                               MSA_ROWS=1, PRECISIONS=fp32)
set -euo pipefail
build=${1:-build}
fold="$build/apps/fastfold/kuafu-fold"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '[model]\nevoformer_blocks = %s\nextra_msa_blocks = 1\n[data]\nmax_recycles = 0\n' "${BLOCKS:-2}" > "$work/config.toml"
for n in ${LENGTHS:-128 256 512}; do
  python3 - "$n" "${MSA_ROWS:-1}" "$work" <<'PY'
import random, sys
n, rows, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
random.seed(n)
letters = 'ACDEFGHIKLMNPQRSTVWY'
query = ''.join(random.choice(letters) for _ in range(n))
open(f'{work}/q.fasta', 'w').write(f'>random\n{query}\n')
with open(f'{work}/q.a3m', 'w') as a3m:
    a3m.write(f'>random\n{query}\n')
    for row in range(1, rows):
        copy = ''.join(random.choice(letters) if random.random() < 1 / 3 else c for c in query)
        a3m.write(f'>copy{row}\n{copy}\n')
PY
  alignment=()
  if (( ${MSA_ROWS:-1} > 1 )); then alignment=(--a3m "$work/q.a3m"); fi
  for chunk in ${CHUNKS:-0 64}; do
    for dap in ${DAP:-1}; do
     for precision in ${PRECISIONS:-fp32}; do
      rm -f "$work/q.pdb"
      launch=("$fold") threads=2
      if (( dap > 1 )); then launch=("$build/tools/kuafu-run" --nproc-per-node "$dap" "$fold") threads=1; fi
      start=$(date +%s.%N)
      # GNU time's peak covers the launcher's ranks (Linux reports the largest waited-for descendant's).
      /usr/bin/time -f '%M' -o "$work/rss" "${launch[@]}" predict --config "$work/config.toml" --set "data.chunk_size=$chunk" \
        --set "parallel.dap.size=$dap" --set runtime.threads=$threads --set "precision.dtype=\"$precision\"" --fasta "$work/q.fasta" "${alignment[@]}" --out "$work/q.pdb" \
        --checkpoint init > /dev/null 2>&1
      seconds=$(python3 -c "import time; print(round(time.time() - $start, 1))")
      echo "{\"residues\": $n, \"msa_rows\": ${MSA_ROWS:-1}, \"chunk_size\": $chunk, \"dap\": $dap, \"precision\": \"$precision\", \"peak_rss_mb\": $(( $(cat "$work/rss") / 1024 )), \"seconds\": $seconds}"
     done
    done
  done
done
