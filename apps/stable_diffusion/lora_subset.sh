#!/usr/bin/env bash
# LoRA fine-tuning of the emoji demo's model on a subset moves its samples toward the subset
# (docs/stable_diffusion.md). The subset (tone_subset.py): the dark-skin-tone images of every other toned
# base (group a), captioned by the base's name alone, so what the images share is not named and the
# adapters have to learn it as the look of those names. Measured (tone_score.py, the real images' tone
# palette): the share of samples whose skin tone is dark, when the bases' bare names are prompted, before
# and after the adapters, for group a and for group b, whose images the adapters never saw.
# Needs demo.sh's trained pipeline (<demo>/p2). About 5 minutes here.
# Usage: apps/stable_diffusion/lora_subset.sh [build dir = build] [demo out = runs/sd_demo_long] [out = runs/sd_lora_subset]
set -euo pipefail
build=${1:-build}
demo=${2:-runs/sd_demo_long}
out=${3:-runs/sd_lora_subset}
here=$(dirname "$0")
sd="$build/apps/stable_diffusion/kuafu-sd"
python=.venv/bin/python
[[ -x $sd ]] || { echo "$sd not found: build first (scripts/build)" >&2; exit 1; }
[[ -d $demo/p2 ]] || { echo "$demo/p2 not found: run apps/stable_diffusion/demo.sh build $demo first" >&2; exit 1; }

[[ -d $out/data ]] || "$python" "$here/tone_subset.py" data/emoji "$out/data"
sets=(--set "model.pipeline=\"$demo/p2\"" --set "data.train=\"$out/data/train\"" --set "data.val=\"$out/data/val\""
      --set "train.out_dir=\"$out/lora\"" --set lora.rank=8 --set lora.alpha=8 --set "train.steps=${LORA_STEPS:-300}"
      --set train.eval_interval=100 --set train.eval_rows=64 --set train.checkpoint_interval=300 --set optim.lr=5e-4
      --set optim.warmup_steps=20 --set optim.ema_decay=0 --set 'sample.prompts=[]')
config="$here/configs/demo_emoji.toml"
"$sd" finetune --config "$config" "${sets[@]}"
[[ -d $out/p3 ]] || "$sd" export --config "$config" "${sets[@]}" --out "$out/p3"

: > "$out/scores.jsonl"
for model in p2 p3; do
  folder=$([[ $model == p2 ]] && echo "$demo/p2" || echo "$out/p3")
  for group in a b; do
    prompts=()
    while IFS= read -r name; do prompts+=(--prompt "$name"); done < "$out/data/prompts_$group.txt"
    grid="$out/${model}_$group.png"
    "$sd" sample --model "$folder" --steps 50 --guidance "${GUIDANCE:-4}" --seed 1 "${prompts[@]}" --out "$grid" > /dev/null
    "$python" "$here/tone_score.py" data/emoji "$grid" "$out/data/dark_$group.txt" --size 32 |
      "$python" "$here/dark_share.py" model=$model group=$group >> "$out/scores.jsonl"
  done
done
cat "$out/scores.jsonl"
