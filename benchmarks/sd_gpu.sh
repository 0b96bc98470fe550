#!/usr/bin/env bash
# Stable Diffusion on one GPU (docs/gpu.md, "Stable Diffusion"), in order of what matters most:
#   1. the Fashion-MNIST check's DDIM-50 against DDPM-1000 on PER_CLASS samples of each class from the same
#      initial noise, for the Min-SNR and the plain UNet (fashion_check.sh's models), scored by
#      fashion_score.py's classifier;
#   2. UNet sampling steps/s at SD 1.x's size (DDIM-50, guidance 7.5, one image): kuafu-sd benchmark
#      --set benchmark.sampling_steps=50 against benchmarks/sd_sampling_diffusers.py, fp32 and bf16;
#   3. SD 1.x-sized UNet training memory at 512 px, batch 1: plain fp32, bf16 + checkpointing, bf16 +
#      checkpointing + Gemini auto within a 2,048 MiB device budget;
#   4. (time left) `kuafu-chat benchmark` at OPT-125m, the actor plain: generation since rows are sampled
#      in one call.
# JSON lines into OUT_DIR/sd_gpu.jsonl, logs into OUT_DIR/sd_gpu.log, sample grids into OUT_DIR/fashion.tar.
# SDXL's base at 1024 px in parts 2 and 3: SD15_CONFIG=apps/stable_diffusion/configs/benchmark_sdxl.toml
# SD15_UNET=apps/stable_diffusion/configs/sdxl_unet/unet PARTS="sampling memory".
#
# usage: SD=kuafu-sd FASHION_MODELS=dir OUT_DIR=out [CHAT=kuafu-chat] [PYTHON=python3] [DEVICE=cuda]
#          [PER_CLASS=50] [DEADLINE=500] [SD15_CONFIG=toml SD15_UNET=dir] [PARTS="fashion sampling memory chat"]
#          [SAMPLING_STEPS=50] [PRECISIONS="fp32 bf16"] [MEMORY_RUNS="plain saving gemini"] [BUDGET_MB=2048]
#          benchmarks/sd_gpu.sh
#   FASHION_MODELS (part 1 only) holds p2_min_snr/ (a pipeline), classifier.pt and optionally plain_unet/ (the
#   plain run's unet/).
set -uo pipefail
SD=${SD:-build/apps/stable_diffusion/kuafu-sd}
CHAT=${CHAT:-}
PARTS=" ${PARTS:-fashion sampling memory chat} "
wanted() { [[ $PARTS == *" $1 "* ]]; }
MODELS=${FASHION_MODELS:-}
wanted fashion && [[ -z $MODELS ]] && { echo "FASHION_MODELS names the Fashion-MNIST models folder" >&2; exit 2; }
SAMPLING_STEPS=${SAMPLING_STEPS:-50}
BUDGET_MB=${BUDGET_MB:-2048}
OUT_DIR=${OUT_DIR:-runs/sd_gpu}
PYTHON=${PYTHON:-.venv/bin/python}
DEVICE=${DEVICE:-cuda}
PER_CLASS=${PER_CLASS:-50}
DEADLINE=${DEADLINE:-500}  # seconds: a step starts only with time left, and stops at the deadline
sd15=${SD15_CONFIG:-apps/stable_diffusion/configs/benchmark_sd15.toml}  # (another UNet, to try the script)
sd15_unet=${SD15_UNET:-apps/stable_diffusion/configs/sd15_unet/unet}
here=$(dirname "$0")
mkdir -p "$OUT_DIR"
jsonl="$OUT_DIR/sd_gpu.jsonl"
logfile="$OUT_DIR/sd_gpu.log"
work=$(mktemp -d)
log() { echo "== [$SECONDS s] $*" | tee -a "$logfile" >&2; }
left() { echo $((DEADLINE - SECONDS)); }
capped() { local limit=$(left); ((limit > $1)) && limit=$1; echo "$limit"; }  # min(seconds, time left)
record() { echo "$1" | tee -a "$jsonl"; }
# label seconds command...: runs it within min(seconds, time left), its stdout's JSON lines recorded with the label.
measured() {
  local label=$1 limit
  limit=$(capped "$2")
  shift 2
  if ((limit < 10)); then log "$label skipped: out of time"; return; fi
  log "$label"
  local line
  if line=$(timeout "$limit" "$@" 2>>"$logfile" | grep '^{' | tail -1) && [[ -n $line ]]; then
    record "{\"label\": \"$label\", \"line\": $line}"
  else
    log "$label failed"
  fi
}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$logfile"

# 1. Fashion-MNIST: DDIM-50 against DDPM-1000 from the same initial noise (seed 1, guidance 3).
if wanted fashion; then
cp -r "$MODELS/p2_min_snr" "$work/min_snr"
variants=(min_snr)
if [[ -d $MODELS/plain_unet ]]; then
  cp -r "$MODELS/p2_min_snr" "$work/plain" && rm -rf "$work/plain/unet" && cp -r "$MODELS/plain_unet" "$work/plain/unet"
  variants+=(plain)
fi
captions=("a t-shirt" "trousers" "a pullover" "a dress" "a coat" "a sandal" "a shirt" "a sneaker" "a bag" "an ankle boot")
prompts=()
: > "$work/prompts.txt"
for ((i = 0; i < PER_CLASS; ++i)); do
  for c in "${captions[@]}"; do prompts+=(--prompt "$c"); echo "$c" >> "$work/prompts.txt"; done
done
mkdir -p "$work/grids"
for variant in "${variants[@]}"; do
  for sampler in "ddim 50" "ddpm 1000"; do
    set -- $sampler
    name="${variant}_$1$2"
    limit=$(capped 150)
    log "fashion $name ($((10 * PER_CLASS)) samples)"
    start=$SECONDS
    if timeout "$limit" "$SD" sample --model "$work/$variant" --sampler "$1" --steps "$2" --guidance 3 --seed 1 --device "$DEVICE" \
        "${prompts[@]}" --out "$work/grids/samples_$name.png" >>"$logfile" 2>&1; then
      seconds=$((SECONDS - start))
      score=$("$PYTHON" "$here/../apps/stable_diffusion/fashion_score.py" score "$MODELS/classifier.pt" "$work/grids/samples_$name.png" "$work/prompts.txt")
      record "{\"label\": \"fashion\", \"run\": \"$name\", \"n\": $((10 * PER_CLASS)), \"seconds\": $seconds, \"score\": $score}"
      "$PYTHON" "$here/../apps/stable_diffusion/fashion_score.py" grid "$work/grids/samples_$name.png" "$work/grids/grid_$name.png" --rows 4
    else
      log "fashion $name failed"
    fi
  done
done
tar -C "$work/grids" -cf "$OUT_DIR/fashion.tar" .
fi

# 2. Sampling steps/s at SD 1.x's size, Kuafu and diffusers alternating.
sampling=(--set runtime.device=\""$DEVICE"\" --set benchmark.sampling_steps=$SAMPLING_STEPS --set benchmark.steps=3 --set benchmark.warmup=1)
wanted sampling || PRECISIONS=" "
for precision in ${PRECISIONS:-fp32 bf16}; do
  measured "sampling kuafu $precision" 90 "$SD" benchmark --config $sd15 "${sampling[@]}" --set precision.dtype=\"$precision\"
  measured "sampling diffusers $precision" 90 "$PYTHON" "$here/sd_sampling_diffusers.py" "$sd15_unet" $SAMPLING_STEPS 3 \
    "$precision" "$DEVICE" 1 8
done

# 3. Training memory at SD 1.x's size.
training=(--set runtime.device=\""$DEVICE"\" --set benchmark.steps=3 --set benchmark.warmup=1)
saving=(--set precision.dtype=\"bf16\" --set memory.activation_checkpointing=true)
runs=" ${MEMORY_RUNS:-plain saving gemini} "
wanted memory || runs=" "
[[ $runs == *" plain "* ]] && measured "memory plain fp32" 120 "$SD" benchmark --config $sd15 "${training[@]}"
[[ $runs == *" saving "* ]] && measured "memory bf16 checkpointing" 120 "$SD" benchmark --config $sd15 "${training[@]}" "${saving[@]}"
[[ $runs == *" gemini "* ]] && measured "memory bf16 checkpointing gemini auto $BUDGET_MB" 150 "$SD" benchmark --config $sd15 \
  "${training[@]}" "${saving[@]}" --set memory.strategy=\"gemini\" --set memory.placement=\"auto\" --set memory.device_budget_mb=$BUDGET_MB

# 4. Chat RLHF's PPO step at OPT-125m (issue 30), with what time is left.
if [[ -n $CHAT ]] && wanted chat; then
  measured "chat ppo-opt-125m plain" 200 "$CHAT" benchmark --config apps/chat_rlhf/configs/ppo-opt-125m.toml \
    --set runtime.device=\""$DEVICE"\" --set benchmark.steps=5 --set benchmark.warmup=2 \
    --set memory.strategy=\"none\" --set models.reference.memory.offload_frozen=false
fi
rm -rf "$work"
log "done"
