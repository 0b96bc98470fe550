#!/usr/bin/env bash
# Kuafu's Evoformer block against AlphaFold 2.3's own JAX block on this machine (issue 52): AlphaFold 2's
# sizes (c_m 256, c_z 128), S = 128 MSA rows, each R in turn; the two programs alternate for ROUNDS rounds
# (each prints the median of 5 steps after 2 warm-up steps) and the line per R gives each side's median
# of those and their ratio. Both single-process on every core; XLA compiles before its warm-up.
# Usage: benchmarks/evoformer_block.sh [build dir = build] [AFVENV = /work/afvenv]   (ROUNDS=3, LENGTHS="64 128 256")
set -euo pipefail
build=${1:-build}
afvenv=${2:-/work/afvenv}
rounds=${ROUNDS:-3}
here="$(dirname "$0")"
for r in ${LENGTHS:-64 128 256}; do
  kuafu=() jax=()
  for ((i = 0; i < rounds; i++)); do
    kuafu+=("$("$build/benchmarks/evoformer_block" --residues "$r" --msa-rows 128 | tail -1)")
    jax+=("$("$afvenv/bin/python" "$here/evoformer_block_jax.py" --residues "$r" --msa-rows 128 2>/dev/null | tail -1)")
  done
  printf '%s\n' "${kuafu[@]}" "${jax[@]}" | python3 -c '
import json, statistics, sys
rows = [json.loads(line) for line in sys.stdin]
median = lambda impl: statistics.median(r["median_s"] for r in rows if r["impl"] == impl)
k, j = median("kuafu"), median("alphafold_jax")
print(json.dumps({"residues": rows[0]["residues"], "msa_rows": rows[0]["msa_rows"], "kuafu_s": k, "alphafold_jax_s": j,
                  "kuafu_over_jax": k / j, "rounds": len(rows) // 2}))'
done
