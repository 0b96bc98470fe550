#!/usr/bin/env bash
# What building Stable Diffusion 1.5's UNet (860M parameters, apps/stable_diffusion/configs/
# benchmark_sd15.toml: its config only, random weights) costs in host memory against what its steps hold
# (issue 32, item 3), under the two ways of training it that hold less than a float32 model:
#   lora    bf16, LoRA rank 4 on the attention projections: the frozen base is held in bf16;
#   gemini  bf16, Gemini (device budget 2 GiB, host 12 GiB, placement auto): chunks, no whole model.
# `kuafu-sd benchmark`, 1 timed step, no warm-up; plain SGD without momentum, so that the steps hold no
# optimizer state and a build that held more than training shows (setup_peak_in_use_mb above
# steps_peak_in_use_mb). One JSON line per variant and run: the benchmark's memory figures and the
# process's maximum resident set. CPU only: the figures are host memory.
# Usage: benchmarks/sd_build_peak.sh [build = build] [out = runs/sd_build_peak] [runs = 1]
#                                    [kuafu-sd = <build>/apps/stable_diffusion/kuafu-sd]
set -euo pipefail
build=${1:-build}
out=${2:-runs/sd_build_peak}
runs=${3:-1}
app=${4:-$build/apps/stable_diffusion/kuafu-sd}
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
mkdir -p "$out"
config="$(cd "$(dirname "$0")/.." && pwd)/apps/stable_diffusion/configs/benchmark_sd15.toml"
common=(--set precision.dtype='"bf16"' --set memory.activation_checkpointing=true --set optim.name='"sgd"'
        --set optim.momentum=0 --set benchmark.warmup=0 --set benchmark.steps=1 --set 'runtime.device="cpu"')
declare -A variants=(
  [lora]="--set lora.rank=4 --set lora.alpha=4.0"
  [gemini]="--set memory.strategy=\"gemini\" --set memory.placement=\"auto\" --set memory.device_budget_mb=2048 --set memory.host_budget_mb=12288"
)
for run in $(seq 1 "$runs"); do
  for variant in lora gemini; do
    log="$out/${variant}_$run.log"
    # shellcheck disable=SC2086  # the variant's settings are words
    if ! /usr/bin/time -v "$app" benchmark --config "$config" "${common[@]}" ${variants[$variant]} > "$log" 2>&1; then
      echo "$variant run $run failed: $(tail -n 3 "$log")" >&2
      continue
    fi
    resident_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
    grep '^{' "$log" | tail -n 1 | python3 -c '
import json, sys
line = json.loads(sys.stdin.read())
keys = ["setup_peak_in_use_mb", "steps_peak_in_use_mb", "peak_in_use_mb", "step_time_ms_median"]
print(json.dumps({"variant": sys.argv[1], "run": int(sys.argv[2]), **{k: line.get(k) for k in keys},
                  "max_resident_mb": round(int(sys.argv[3]) / 1024)}))' "$variant" "$run" "$resident_kb"
  done
done
