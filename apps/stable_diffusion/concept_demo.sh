#!/usr/bin/env bash
# Textual inversion on the emoji demo's model (docs/stable_diffusion.md): a new word, <dark>, learnt from a
# handful of images while every weight of the pipeline stays frozen. The images: lora_subset.sh's subset
# (tone_subset.py), the dark-skin-tone images of every other toned base (group a), each captioned
# "<its base's name> {}" with {} read as the new word (textual_inversion.captions = "images"), so the word
# has to carry what the images share and their names do not say. Measured (tone_score.py, the real images'
# tone palette): the share of samples whose skin tone is dark when each base's bare name is prompted, and
# when the name is followed by <dark>, for group a and for group b (bases whose images the word never saw).
# Needs demo.sh's trained pipeline (<demo>/p2). About 5 minutes here.
# Usage: apps/stable_diffusion/concept_demo.sh [build dir = build] [demo out = runs/sd_demo_long] [out = runs/sd_concept]
set -euo pipefail
build=${1:-build}
demo=${2:-runs/sd_demo_long}
out=${3:-runs/sd_concept}
here=$(dirname "$0")
sd="$build/apps/stable_diffusion/kuafu-sd"
python=.venv/bin/python
[[ -x $sd ]] || { echo "$sd not found: build first (scripts/build)" >&2; exit 1; }
[[ -d $demo/p2 ]] || { echo "$demo/p2 not found: run apps/stable_diffusion/demo.sh build $demo first" >&2; exit 1; }

if [[ ! -d $out/data ]]; then
  "$python" "$here/tone_subset.py" data/emoji "$out/data"
  for caption in "$out"/data/{train,val}/*/*.txt; do printf '%s {}' "$(cat "$caption")" > "$caption"; done
fi
token="<dark>"
sets=(--set "model.pipeline=\"$demo/p2\"" --set "data.train=\"$out/data/train\"" --set "data.val=\"$out/data/val\""
      --set "train.out_dir=\"$out/run\"" --set 'model.train="textual_inversion"' --set "textual_inversion.token=\"$token\""
      --set 'textual_inversion.initializer="d"' --set "textual_inversion.vectors=${VECTORS:-4}"
      --set 'textual_inversion.captions="images"' --set "train.steps=${CONCEPT_STEPS:-300}" --set train.eval_interval=100
      --set train.eval_rows=64 --set train.checkpoint_interval=300 --set "optim.lr=${CONCEPT_LR:-5e-3}" --set optim.warmup_steps=20
      --set optim.weight_decay=0 --set optim.ema_decay=0 --set diffusion.caption_dropout=0 --set 'sample.prompts=[]')
config="$here/configs/demo_emoji.toml"
"$sd" train --config "$config" "${sets[@]}"
[[ -d $out/embedding ]] || "$sd" export --config "$config" "${sets[@]}" --out "$out/embedding"

: > "$out/scores.jsonl"
for words in bare concept; do
  for group in a b; do
    prompts=()
    while IFS= read -r name; do
      prompts+=(--prompt "$([[ $words == bare ]] && echo "$name" || echo "$name $token")")
    done < "$out/data/prompts_$group.txt"
    grid="$out/${words}_$group.png"
    "$sd" sample --model "$demo/p2" --embedding "$out/embedding/learned_embeds.safetensors" --steps 50 --guidance "${GUIDANCE:-4}" \
      --seed 1 "${prompts[@]}" --out "$grid" > /dev/null
    "$python" "$here/tone_score.py" data/emoji "$grid" "$out/data/dark_$group.txt" --size 32 |
      "$python" "$here/dark_share.py" prompts=$words group=$group >> "$out/scores.jsonl"
  done
done
cat "$out/scores.jsonl"
