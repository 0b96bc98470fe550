#!/usr/bin/env bash
# Does kuafu-fold learn across chains? (issue 52, docs/fastfold.md "Learning"): configs/tiny.toml's model
# trained with recycling (up to MAX_RECYCLES, drawn per step) for STEPS steps from two seeds at once (one
# thread each, so both fit this machine's 2 cores in about an hour), each evaluated on the held-out
# validation chains (whole chains up to data.eval_crop_size residues, never trained on, nor any chain within
# 30% identity of them) with every recycling iteration and with none, against the ideal-helix and
# secondary-structure baselines. One JSON line per (seed, recycles at evaluation); the curves are in each
# run's metrics.jsonl (scripts/report).
# Usage: benchmarks/fold_learning_study.sh [build dir = build] [out = runs/fold_study]   (SEEDS="0 1", STEPS=6000, MAX_RECYCLES=2,
#        SETS="--set model.evoformer_blocks=1": further overrides of tiny.toml, for training and evaluation alike)
set -euo pipefail
build=${1:-build}
out=${2:-runs/fold_study}
fold="$build/apps/fastfold/kuafu-fold"
config="$(dirname "$0")/../apps/fastfold/configs/tiny.toml"
steps=${STEPS:-6000}
recycles=${MAX_RECYCLES:-2}
[[ -d data/fastfold_tiny ]] || "$fold" prepare --config "$config"
sets() {  # the run of seed $1, recycling up to $2
  echo --set "train.out_dir=\"$out/seed$1\"" --set "train.seed=$1" --set "train.steps=$steps" \
    --set "train.eval_interval=$((steps / 3))" --set "train.checkpoint_interval=$((steps / 3))" \
    --set "data.max_recycles=$2" --set runtime.threads=1 ${SETS:-}
}
mkdir -p "$out"
start=$(date +%s)
pids=()
for seed in ${SEEDS:-0 1}; do
  # shellcheck disable=SC2046
  "$fold" train --config "$config" $(sets "$seed" "$recycles") > "$out/train_seed$seed.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # a failed run fails the study (its log says why)
echo "{\"trained_minutes\": $(( ($(date +%s) - start) / 60 ))}"
evals=("$recycles")
(( recycles > 0 )) && evals+=(0)  # with every recycling iteration and with none
for seed in ${SEEDS:-0 1}; do
  for at_eval in "${evals[@]}"; do
    # shellcheck disable=SC2046
    line=$("$fold" eval --config "$config" $(sets "$seed" "$at_eval") 2>/dev/null | tail -1)
    echo "{\"seed\": $seed, \"recycles_at_eval\": $at_eval, \"eval\": $line}"
  done
done
