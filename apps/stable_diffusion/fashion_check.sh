#!/usr/bin/env bash
# The class-conditional Fashion-MNIST check (docs/stable_diffusion.md): does guidance give the prompted
# class, judged by a classifier that shares no code with Kuafu?
#   1. `init` a pipeline of configs/fashion_mnist.toml's shapes (28 px grey images, 14x14x4 latents);
#   2. the VAE trained (VAE_STEPS, 800) and exported;
#   3. the UNet trained twice from it, with Min-SNR-5 and without (UNET_STEPS, 1,500 each), each exported;
#   4. a PyTorch classifier trained on the real images (fashion_score.py; it must reach 90% on the real
#      test set);
#   5. guided samples (guidance 3) of each class's caption, scored: the share the classifier puts in the
#      prompted class (chance 10%), into <out>/scores.jsonl: 50 per class from each UNet with DDIM-50, and
#      10 per class from the Min-SNR UNet with DDIM-50 and with DDPM-1000 from the same initial noise; the
#      first four of each class as grids (a class per column).
# Steps already done (a folder that exists) are kept. About 90 minutes on this machine (2 cores), 25 of them
# DDPM's 1,000 steps; VARIANTS=min_snr DDPM=0 trains and scores one UNet (under 30 minutes).
# (benchmarks/sd_gpu.sh compares DDIM-50 with DDPM-1000 on 1,000 samples on a GPU.)
# Usage: apps/stable_diffusion/fashion_check.sh [build dir = build] [out = runs/sd_fashion]
set -euo pipefail
build=${1:-build}
out=${2:-runs/sd_fashion}
here=$(dirname "$0")
sd="$build/apps/stable_diffusion/kuafu-sd"
config="$here/configs/fashion_mnist.toml"
python=.venv/bin/python
[[ -x $sd ]] || { echo "$sd not found: build first (scripts/build)" >&2; exit 1; }
at() { echo "--set" "$1=\"$2\""; }
stage_sets() {  # pipeline run-folder: the keys every stage sets
  echo $(at model.pipeline "$1") $(at train.out_dir "$2")
}
timed() {  # label command...: runs it, appending its wall time to <out>/times.txt
  local start=$SECONDS
  "${@:2}"
  echo "$1 $((SECONDS - start)) s" >> "$out/times.txt"
}

mkdir -p "$out"
[[ -d $out/p0 ]] || "$sd" init --config "$config" --out "$out/p0"

vae_sets=($(stage_sets "$out/p0" "$out/vae") $(at model.train vae) --set "train.steps=${VAE_STEPS:-800}" --set optim.ema_decay=0
          --set train.eval_interval=200 --set train.checkpoint_interval=400)
[[ -d $out/p1 ]] || timed vae "$sd" train --config "$config" "${vae_sets[@]}"
[[ -d $out/p1 ]] || "$sd" export --config "$config" "${vae_sets[@]}" --out "$out/p1"

for variant in ${VARIANTS:-min_snr plain}; do
  gamma=$([[ $variant == min_snr ]] && echo 5 || echo 0)
  unet_sets=($(stage_sets "$out/p1" "$out/unet_$variant") --set "train.steps=${UNET_STEPS:-1500}" --set "diffusion.min_snr_gamma=$gamma")
  [[ -d $out/p2_$variant ]] || timed "unet_$variant" "$sd" train --config "$config" "${unet_sets[@]}"
  [[ -d $out/p2_$variant ]] || "$sd" export --config "$config" "${unet_sets[@]}" --out "$out/p2_$variant"
done

[[ -f $out/classifier.pt ]] || "$python" "$here/fashion_score.py" train "$out/classifier.pt" | tee "$out/classifier.log"

# PER prompts of each class (classes interleaved, so a grid row holds every class) into <out>/prompts_<PER>.txt.
captions=("a t-shirt" "trousers" "a pullover" "a dress" "a coat" "a sandal" "a shirt" "a sneaker" "a bag" "an ankle boot")
prompts_file() {
  local file="$out/prompts_$1.txt"
  : > "$file"
  for ((i = 0; i < $1; ++i)); do printf '%s\n' "${captions[@]}" >> "$file"; done
  echo "$file"
}
score() {  # label pipeline sampler steps per-class
  local grid="$out/samples_$1.png" list
  list=$(prompts_file "$5")
  local prompts=()
  while IFS= read -r caption; do prompts+=(--prompt "$caption"); done < "$list"
  [[ -f $grid ]] || timed "sample_$1" "$sd" sample --model "$2" --sampler "$3" --steps "$4" --guidance "${GUIDANCE:-3}" --seed 1 \
    "${prompts[@]}" --out "$grid"
  echo "{\"run\": \"$1\", \"score\": $("$python" "$here/fashion_score.py" score "$out/classifier.pt" "$grid" "$list")}" \
    >> "$out/scores.jsonl"
  "$python" "$here/fashion_score.py" grid "$grid" "$out/grid_$1.png" --rows 4
}
: > "$out/scores.jsonl"
for variant in ${VARIANTS:-min_snr plain}; do score "${variant}_ddim50" "$out/p2_$variant" ddim 50 50; done
if [[ ${DDPM:-1} == 1 ]]; then
  score min_snr_ddim50_n100 "$out/p2_min_snr" ddim 50 10
  score min_snr_ddpm1000_n100 "$out/p2_min_snr" ddpm 1000 10
fi
cat "$out/scores.jsonl"
echo "wrote $out/scores.jsonl, $out/times.txt and $out/grid_*.png"
