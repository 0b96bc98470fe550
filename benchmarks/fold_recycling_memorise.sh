#!/usr/bin/env bash
# Does recycling help where the first pass has a structure to refine? (issue 52, docs/fastfold.md "Recycling")
# On held-out chains the tiny models reach lDDT-Ca 0.3-0.37 and recycling gains nothing
# (benchmarks/fold_learning_study.sh). Here the one-block model learns CHAINS training chains and is scored
# on those same chains whole, where its first pass gets far further: trained with 0-MAX_RECYCLES recycles
# drawn per step and trained without (both at once, one thread each), each evaluated with MAX_RECYCLES
# recycles and with none. One JSON line per (training, recycles at evaluation).
# Usage: benchmarks/fold_recycling_memorise.sh [build dir = build] [out = runs/fold_memorise]
#        (CHAINS=8 of at most 128 residues, STEPS=1500, MAX_RECYCLES=3, SEED=0, SETS: further overrides)
set -euo pipefail
build=${1:-build}
out=${2:-runs/fold_memorise}
fold="$build/apps/fastfold/kuafu-fold"
config="$(dirname "$0")/../apps/fastfold/configs/tiny.toml"
chains=${CHAINS:-8}
steps=${STEPS:-1500}
recycles=${MAX_RECYCLES:-3}
seed=${SEED:-0}
source_dir=data/fastfold_tiny
[[ -d $source_dir ]] || "$fold" prepare --config "$config"

# The folder: the first CHAINS training chains short enough to be scored whole, listed once as training
# chains and once as validation chains (the same MSAs).
data="$out/data"
mkdir -p "$data"
ln -sfn "$(realpath "$source_dir/msas")" "$data/msas"
awk -v n="$chains" -v most=128 -v OFS='\t' '
  /^#/ || /^chain_id/ { print > table; next }
  $4 == "train" && $3 <= most && picked < n { print > table; $4 = "val"; val[++picked] = $0 }
  END {
    if (picked < n) { print "only " picked " training chains of at most " most " residues" > "/dev/stderr"; exit 1 }
    for (i = 1; i <= picked; i++) print val[i] > table
  }' table="$data/chains.tsv" "$source_dir/chains.tsv"

sets() {  # the run recycling up to $1 in training ($2 at evaluation)
  echo --set "train.out_dir=\"$out/recycles$1\"" --set "train.seed=$seed" --set "train.steps=$steps" \
    --set "train.eval_interval=$((steps / 3))" --set "train.checkpoint_interval=$((steps / 3))" \
    --set "data.dir=\"$data\"" --set "data.eval_chains=$chains" --set "data.max_recycles=$2" \
    --set model.evoformer_blocks=1 --set runtime.threads=1 ${SETS:-}
}
start=$(date +%s)
pids=()
for trained in "$recycles" 0; do
  # shellcheck disable=SC2046
  "$fold" train --config "$config" $(sets "$trained" "$trained") > "$out/train_recycles$trained.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # a failed run fails the study (its log says why)
echo "{\"trained_minutes\": $(( ($(date +%s) - start) / 60 ))}"
for trained in "$recycles" 0; do
  for at_eval in "$recycles" 0; do
    # shellcheck disable=SC2046
    line=$("$fold" eval --config "$config" $(sets "$trained" "$at_eval") 2>/dev/null | tail -1)
    echo "{\"recycles_in_training\": $trained, \"recycles_at_eval\": $at_eval, \"eval\": $line}"
  done
done
