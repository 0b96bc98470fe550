#!/usr/bin/env bash
# The emoji text-to-image demo, trained from scratch on this machine's data (docs/stable_diffusion.md):
#   1. `prepare`: Debian's ruby-tanuki-emoji as captioned 72 px images, one skin tone per toned base held
#      out (data/emoji/train, data/emoji/held_out);
#   2. `init`: a new pipeline folder (character-level CLIP tokenizer, text encoder, VAE, UNet) of
#      configs/demo_emoji.toml's init.* shapes;
#   3. the VAE trained on the images (reconstruction + KL), exported with its latents' scaling factor;
#   4. the UNet trained on its latents and the captions (caption drop-out, Min-SNR-5, moving average),
#      exported as a pipeline folder diffusers loads;
#   5. every held-out (emoji, tone) caption sampled and its skin tone measured against the real images'
#      palette (<out>/tone_score.json), the first eight as <out>/held_out_grid.png.
# About 35 minutes on this machine (docs/stable_diffusion.md has its figures). Steps already done (a folder
# that exists) are kept. VAE_STEPS (2,000) and UNET_STEPS (8,000) change the lengths.
# Usage: apps/stable_diffusion/demo.sh [build dir = build] [out = runs/sd_demo]
set -euo pipefail
build=${1:-build}
out=${2:-runs/sd_demo}
sd="$build/apps/stable_diffusion/kuafu-sd"
config="$(dirname "$0")/configs/demo_emoji.toml"
[[ -x $sd ]] || { echo "$sd not found: build first (scripts/build)" >&2; exit 1; }
at() { echo "--set" "$1=\"$2\""; }
stage_sets() {  # pipeline run-folder: the keys every stage sets
  echo $(at model.pipeline "$1") $(at train.out_dir "$2")
}

[[ -d data/emoji/train ]] || "$sd" prepare --config "$config"
[[ -d $out/p0 ]] || "$sd" init --config "$config" --out "$out/p0"

vae_sets=($(stage_sets "$out/p0" "$out/vae") $(at model.train vae) --set "train.steps=${VAE_STEPS:-2000}" --set optim.ema_decay=0)
"$sd" train --config "$config" "${vae_sets[@]}"
[[ -d $out/p1 ]] || "$sd" export --config "$config" "${vae_sets[@]}" --out "$out/p1"

unet_sets=($(stage_sets "$out/p1" "$out/unet") --set "train.steps=${UNET_STEPS:-8000}")
"$sd" train --config "$config" "${unet_sets[@]}"
[[ -d $out/p2 ]] || "$sd" export --config "$config" "${unet_sets[@]}" --out "$out/p2"

# The held-out captions: (emoji, tone) pairs the UNet never saw. All of them sampled and scored against the
# real images' tone palette (tone_score.py; chance 0.2); the first eight as the grid to look at.
captions=()
for file in data/emoji/held_out/*/*.txt; do captions+=("$(cat "$file")"); done
printf '%s\n' "${captions[@]}" > "$out/held_out_captions.txt"
prompts=()
for caption in "${captions[@]}"; do prompts+=(--prompt "$caption"); done
sample=("$sd" sample --model "$out/p2" --steps 50 --guidance "${GUIDANCE:-4}" --seed 1)
"${sample[@]}" "${prompts[@]:0:16}" --out "$out/held_out_grid.png"
"${sample[@]}" "${prompts[@]}" --out "$out/held_out_all.png"
.venv/bin/python "$(dirname "$0")/tone_score.py" data/emoji "$out/held_out_all.png" "$out/held_out_captions.txt" --size 32 \
  > "$out/tone_score.json"
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print('held-out tone accuracy', d['tone_accuracy'], 'of', d['images'], '(chance 0.2)')" \
  "$out/tone_score.json"
echo "wrote $out/held_out_grid.png, $out/held_out_all.png and $out/tone_score.json"
