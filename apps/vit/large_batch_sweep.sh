#!/usr/bin/env bash
# The LAMB large-batch result at the seed's data ratio: Fashion-MNIST (60,000 images) with batch 1,536 is
# 2.6% of the set per step, as 32,768 is of ImageNet's 1.28 M. The same model
# (configs/fashion_mnist_small.toml) trains the same number of epochs with
#   AdamW at batch 128 (the baseline: peak rate 1e-3, 1 epoch of warm-up), then AdamW and LAMB at
#   1,536, 4,096 and 8,192, each at its rule's rate and at half and twice that rate:
#   - AdamW: square-root scaling, lr(B) = 1e-3 * sqrt(B / 128);
#   - LAMB (the LAMB paper's recipe): square-root scaling from its own base, lr(B) = 3.75e-3 * sqrt(B / 128)
#     (3e-2 at 8,192, the best of 1e-2 / 3e-2 / 6e-2 in the earlier 20-epoch runs), and linear-epoch
#     warm-up: warm-up epochs grow in proportion to the batch (7.5 epochs at 8,192), so every large batch
#     warms up for the same ~53 steps. AdamW's large-batch runs take the same warm-up.
# Everything else is the config's (cosine decay to 0, weight decay 0.05, clipping at 1, label smoothing
# 0.1, random-resized crops and flips), in bf16 (twice fp32's speed here), evaluated after every epoch.
#
# Each run trains in <out>/<name> (metrics.jsonl, config.toml, the latest checkpoint) and is marked done
# when it finishes; running the script again skips finished runs and resumes an interrupted one from its
# last epoch. At the end: <out>/summary.md, <out>/accuracy_vs_batch.{png,svg} (sweep_summary.py), and
# the curves (scripts/report) of the best rates in <out>/report and of every run in <out>/report_all.
#
# Usage: apps/vit/large_batch_sweep.sh [--build DIR] [--out DIR] [--epochs N] [--dtype bf16|fp32]
#          [--jobs N] [--extend N] [--only "NAME ..."] [--set KEY=VALUE ...] [--list]
#   --jobs N: N runs at a time (a GPU or a many-core machine; give each --set runtime.threads=...)
#   --extend N: rounds of going one rate further where the best rate is the highest or lowest tried (1)
#   --set:    passed to every run (e.g. data.train=..., runtime.device="cuda")
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/build out=runs/vit_large_batch epochs=30 dtype=bf16 jobs=1 extend=1 only="" list=false extra=()
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --extend) extend=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    --list) list=true; shift ;;
    *) echo "large_batch_sweep.sh: unknown argument '$1' (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
fail() { echo "large_batch_sweep.sh: $1" >&2; exit 2; }
[[ $extend =~ ^[0-9]+$ ]] || fail "--extend must be a number of rounds, not '$extend'"
for n in epochs jobs; do
  [[ ${!n} =~ ^[1-9][0-9]*$ ]] || fail "--$n must be a positive integer, not '${!n}'"
done
app=$build/apps/vit/kuafu-vit
config=$here/configs/fashion_mnist_small.toml
images=60000

# A run's line: name optimizer batch micro_batch lr warmup_steps (micro-batches of at most 2,048; the
# baseline warms up for 1 epoch, the large batches for 7.5 epochs x batch / 8,192).
run_line() {  # optimizer batch lr
  awk -v optimizer="$1" -v batch="$2" -v lr="$3" -v images=$images 'BEGIN {
    lr = sprintf("%.3g", lr); steps = int(images / batch); micro = batch > 2048 ? 2048 : batch
    warmup = batch == 128 ? steps : int(steps * 7.5 * batch / 8192 + 0.5)
    printf "%s_b%d_lr%s %s %d %d %s %d\n", optimizer, batch, lr, optimizer, batch, micro, lr, warmup }'
}
rule_rate() {  # base batch factor: base * sqrt(batch / 128) * factor
  awk -v base="$1" -v batch="$2" -v factor="$3" 'BEGIN { printf "%.3g", base * sqrt(batch / 128) * factor }'
}
# The runs in the order they train: the rule's rates first, then half and twice them, then the
# baseline's own search.
plan() {
  run_line adamw 128 1e-3
  for batch in 1536 8192 4096; do
    run_line lamb $batch "$(rule_rate 3.75e-3 $batch 1)"; run_line adamw $batch "$(rule_rate 1e-3 $batch 1)"
  done
  for batch in 1536 8192 4096; do
    for factor in 2 0.5; do run_line lamb $batch "$(rule_rate 3.75e-3 $batch $factor)"; done
    for factor in 2 0.5; do run_line adamw $batch "$(rule_rate 1e-3 $batch $factor)"; done
  done
  run_line adamw 128 2e-3; run_line adamw 128 5e-4
}

if $list; then plan; exit 0; fi
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
mkdir -p "$out"

# A TOML basic string holding $1 (a folder may hold quotes or backslashes).
toml_string() {
  local text=${1//\\/\\\\}
  printf '"%s"' "${text//\"/\\\"}"
}

train_run() {  # name optimizer batch micro lr warmup
  local name=$1 optimizer=$2 batch=$3 micro=$4 lr=$5 warmup=$6
  local dir=$out/$name per_epoch=$((images / batch)) start=$(date +%s)
  echo "$name: training $((per_epoch * epochs)) steps ($epochs epochs of $per_epoch) at lr $lr, warm-up $warmup steps"
  "$app" train --config "$config" --set train.out_dir="$(toml_string "$dir")" --set train.batch_size="$batch" \
    --set train.micro_batch_size="$micro" --set train.steps=$((per_epoch * epochs)) \
    --set train.eval_interval="$per_epoch" --set train.checkpoint_interval="$per_epoch" \
    --set train.keep_checkpoints=1 --set train.log_interval="$per_epoch" --set train.progress='"plain"' \
    --set optim.name="\"$optimizer\"" --set optim.lr="$lr" --set optim.min_lr=0 \
    --set optim.warmup_steps="$warmup" --set precision.dtype="\"$dtype\"" "${extra[@]}" \
    >> "$dir.log" 2>&1 < /dev/null || { echo "$name failed: see $dir.log" >&2; return 1; }
  echo "$(($(date +%s) - start))" >> "$dir/wall_seconds"
  touch "$dir/done"
  echo "$name: $(tail -n 1 "$dir.log")"
}

train_lines() {  # run lines; --jobs at a time; finished runs skipped
  local line name optimizer batch micro lr warmup running=0
  for line in "$@"; do
    read -r name optimizer batch micro lr warmup <<< "$line"
    [[ -z $only || " $only " == *" $name "* ]] || continue
    if [[ -e $out/$name/done ]]; then echo "$name: done"; continue; fi
    train_run "$name" "$optimizer" "$batch" "$micro" "$lr" "$warmup" &
    if ((++running >= jobs)); then
      wait -n || { wait; return 1; }
      ((running--))
    fi
  done
  while ((running > 0)); do
    wait -n || { wait; return 1; }
    ((running--))
  done
}

mapfile -t runs < <(plan)
train_lines "${runs[@]}"
# Where the best rate of an optimizer and batch is the highest or lowest tried, the search goes one
# step (x2 or x0.5) further, --extend rounds at most.
for ((round = 0; round < extend; round++)); do
  mapfile -t beyond < <("$root/.venv/bin/python" "$here/sweep_summary.py" "$out" --beyond-edges)
  ((${#beyond[@]})) || break
  runs=()
  for item in "${beyond[@]}"; do runs+=("$(run_line $item)"); done
  train_lines "${runs[@]}"
done

"$root/.venv/bin/python" "$here/sweep_summary.py" "$out"
mapfile -t best < "$out/best_runs.txt"
"$root/scripts/report" --out "$out/report" --title "Large-batch sweep: the best rate per setting" "${best[@]}"
"$root/scripts/report" --out "$out/report_all" --title "Large-batch sweep: every run" "$out"/*_b*_lr*/
