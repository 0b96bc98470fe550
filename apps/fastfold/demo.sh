#!/usr/bin/env bash
# kuafu-fold's demo on this machine's data (docs/fastfold.md):
#   1. `prepare`: 300 chains of ProMod3's structure database (Debian's promod3-data), split into train /
#      val / test by 30% sequence-identity groups, an a3m MSA per chain searched against the training
#      chains with mmseqs2 (data/fastfold_tiny);
#   2. `train`: configs/tiny.toml's two-block AlphaFold from AlphaFold's initial values on 64-residue crops,
#      evaluated on the validation chains (lDDT-Cα, TM-score, GDT-TS, RMSD, pLDDT's r, the ideal helix's
#      lDDT-Cα as the baseline);
#   3. `predict`: the first test chain (never trained on, nor any chain within 30% identity of it) to a PDB
#      file with pLDDT as B-factors, beside its true backbone, scored, and drawn as <out>/prediction.png
#      (Cα traces superposed, contact maps, pLDDT).
# About 15 minutes here. STEPS (1500) changes the training's length. Steps already done are kept.
# Usage: apps/fastfold/demo.sh [build dir = build] [out = runs/fold_demo]
set -euo pipefail
build=${1:-build}
out=${2:-runs/fold_demo}
fold="$build/apps/fastfold/kuafu-fold"
config="$(dirname "$0")/configs/tiny.toml"
[[ -x $fold ]] || { echo "$fold not found: build first (scripts/build)" >&2; exit 1; }
sets=(--set "train.out_dir=\"$out\"" --set "train.steps=${STEPS:-1500}")

[[ -d data/fastfold_tiny ]] || "$fold" prepare --config "$config"
"$fold" train --config "$config" "${sets[@]}"
"$fold" eval --config "$config" "${sets[@]}"

chain=$(awk -F'\t' '$4 == "test" { print $1; exit }' data/fastfold_tiny/chains.tsv)
rm -f "$out/$chain.predicted.pdb" "$out/$chain.true.pdb"
"$fold" predict --config "$config" "${sets[@]}" --chain "$chain" --out "$out/$chain.predicted.pdb" --truth "$out/$chain.true.pdb"
.venv/bin/python "$(dirname "$0")/plot_prediction.py" "$out/$chain.predicted.pdb" "$out/$chain.true.pdb" "$out/prediction.png"
