#!/usr/bin/env bash
# Does recycling help where the first pass has a structure to refine? (issue 52, docs/fastfold.md "Learning")
# On held-out chains the tiny models reach lDDT-Ca 0.3-0.37 and recycling gains nothing
# (benchmarks/fold_learning_study.sh). Here the one-block model learns CHAINS training chains and is scored
# on those same chains whole, where its first pass gets further: fold_learning_study.sh's run trained with
# 0-MAX_RECYCLES recycles drawn per step and its run trained without, both at once (one thread each), each
# evaluated with its recycles and with none. JSON lines as fold_learning_study.sh's, per training.
# Usage: benchmarks/fold_recycling_memorise.sh [build dir = build] [out = runs/fold_memorise]
#        (CHAINS=8 of at most 128 residues, STEPS=1500, MAX_RECYCLES=3, SEED=0, SETS: further overrides)
set -euo pipefail
build=${1:-build}
out=${2:-runs/fold_memorise}
chains=${CHAINS:-8}
recycles=${MAX_RECYCLES:-3}
source_dir=data/fastfold_tiny
[[ -d $source_dir ]] || "$build/apps/fastfold/kuafu-fold" prepare --config "$(dirname "$0")/../apps/fastfold/configs/tiny.toml"

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

sets="--set data.dir=\"$data\" --set data.eval_chains=$chains --set model.evoformer_blocks=1 ${SETS:-}"
pids=()
for trained in "$recycles" 0; do
  SEEDS=${SEED:-0} STEPS=${STEPS:-1500} MAX_RECYCLES=$trained SETS=$sets \
    "$(dirname "$0")/fold_learning_study.sh" "$build" "$out/recycles$trained" > "$out/recycles$trained.jsonl" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # a failed run fails the study (its log says why)
for trained in "$recycles" 0; do sed "s/^/{\"recycles_in_training\": $trained, \"line\": /; s/$/}/" "$out/recycles$trained.jsonl"; done
