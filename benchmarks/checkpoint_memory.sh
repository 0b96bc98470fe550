#!/usr/bin/env bash
# Saving and loading a checkpoint of docs/memory.md's largest Gemini model (749M parameters: 26 layers of
# width 1536, vocabulary 8192, bf16 compute, AdamW, device budget 2 GiB and host budget 12 GiB per rank,
# placement auto), on 1 and 2 ranks: seconds and peak memory in use of each, beside the steps' own peak.
# kuafu-gpt benchmark with benchmark.checkpoint_dir: 1 warm-up and 2 timed steps, then one save as the
# trainer saves, then a load back into the same state.
#
# Usage: [LAYERS=26] benchmarks/checkpoint_memory.sh [build = build] [out = runs/checkpoint_memory]
#                                        [ranks = "1 2"] [kuafu-gpt = <build>/apps/gpt/kuafu-gpt]
# Prints one JSON line per rank count (rank 0's) and keeps each run's log in <out>. LAYERS sets another
# depth (28.3M parameters a layer): two ranks of 26 layers need more than this 24 GiB machine holds.
# ASYNC_SAVE=true saves as train.async_save does: checkpoint_save_blocking_s is then the time until
# training could go on (the state copied to host memory), checkpoint_save_s until the save is sealed.
# EXTRA: more `--set key=value` arguments, split at spaces (e.g. EXTRA='--set memory.placement="static"').
# checkpoint_load_read_mb is what the load read of the checkpoint's files on rank 0.
set -euo pipefail
build=${1:-build}
out=${2:-runs/checkpoint_memory}
ranks_list=${3:-"1 2"}
app=${4:-$build/apps/gpt/kuafu-gpt}
launcher="$build/tools/kuafu-run"
[[ -x $app && -x $launcher ]] || { echo "$app or $launcher not found: build first (scripts/build)" >&2; exit 1; }
mkdir -p "$out"
config="$(cd "$(dirname "$0")/.." && pwd)/apps/gpt/configs/quickstart.toml"
settings=(--set model.n_layer="${LAYERS:-26}" --set model.n_embd=1536 --set model.n_head=16 --set model.vocab_size=8192
          --set model.n_positions=128 --set data.context=128 --set train.micro_batch_size=4
          --set precision.dtype='"bf16"' --set optim.name='"adamw"' --set memory.strategy='"gemini"'
          --set memory.placement='"auto"' --set memory.margin_ratio=0.8 --set memory.device_budget_mb=2048
          --set memory.host_budget_mb=12288 --set benchmark.warmup=1 --set benchmark.steps=2
          --set train.async_save="${ASYNC_SAVE:-false}")
read -r -a extra <<< "${EXTRA:-}"
settings+=("${extra[@]}")
for ranks in $ranks_list; do
  folder="$out/checkpoints_${ranks}_ranks"
  echo "$ranks rank(s), ${LAYERS:-26} layers" >&2
  rm -rf "$folder"
  log="$out/${ranks}_ranks.log"
  if ! "$launcher" --nproc-per-node "$ranks" --master-port 0 "$app" benchmark --config "$config" "${settings[@]}" \
      --set benchmark.checkpoint_dir="\"$folder\"" > "$log" 2>&1; then
    echo "$ranks rank(s): failed: $(tail -n 3 "$log")" >&2
    continue
  fi
  grep '^{' "$log" | tail -n 1 | python3 -c '
import json, sys
d = json.load(sys.stdin); d["ranks"] = int(sys.argv[1]); d["layers"] = int(sys.argv[2]); print(json.dumps(d))' "$ranks" "${LAYERS:-26}"
  rm -rf "$folder"
done
