#!/usr/bin/env bash
# Kuafu's Evoformer block against AlphaFold 2.3's own JAX block on this machine (issue 52) and, where
# OFVENV has a python (the venv of benchmarks/evoformer_block_pytorch.py's docstring), against OpenFold's
# own PyTorch block too: AlphaFold 2's sizes (c_m 256, c_z 128), S = 128 MSA rows, each R in turn; the
# programs alternate for ROUNDS rounds (each prints the median of 5 steps after 2 warm-up steps) and the
# line per R gives each side's median of those and the ratios. All single-process on every core; XLA
# compiles before its warm-up.
# Usage: benchmarks/evoformer_block.sh [build dir = build] [AFVENV = /work/afvenv] [OFVENV = /work/ofvenv]
#        (ROUNDS=3, LENGTHS="64 128 256")
set -euo pipefail
build=${1:-build}
afvenv=${2:-/work/afvenv}
ofvenv=${3:-/work/ofvenv}
rounds=${ROUNDS:-3}
here="$(dirname "$0")"
pytorch=0
[ -x "$ofvenv/bin/python" ] && pytorch=1
for r in ${LENGTHS:-64 128 256}; do
  kuafu=() jax=() torch=()
  for ((i = 0; i < rounds; i++)); do
    kuafu+=("$("$build/benchmarks/evoformer_block" --residues "$r" --msa-rows 128 | tail -1)")
    jax+=("$("$afvenv/bin/python" "$here/evoformer_block_jax.py" --residues "$r" --msa-rows 128 2>/dev/null | tail -1)")
    if ((pytorch)); then
      torch+=("$("$ofvenv/bin/python" "$here/evoformer_block_pytorch.py" --residues "$r" --msa-rows 128 2>/dev/null | tail -1)")
    fi
  done
  printf '%s\n' "${kuafu[@]}" "${jax[@]}" ${torch[@]+"${torch[@]}"} | python3 -c '
import json, statistics, sys
rows = [json.loads(line) for line in sys.stdin]
median = lambda impl: statistics.median(r["median_s"] for r in rows if r["impl"] == impl)
k, j = median("kuafu"), median("alphafold_jax")
out = {"residues": rows[0]["residues"], "msa_rows": rows[0]["msa_rows"], "kuafu_s": k, "alphafold_jax_s": j,
       "kuafu_over_jax": k / j}
if any(r["impl"] == "openfold_pytorch" for r in rows):
    t = median("openfold_pytorch")
    out.update(pytorch_s=t, kuafu_over_pytorch=k / t)
out["rounds"] = sum(r["impl"] == "kuafu" for r in rows)
print(json.dumps(out))'
done
