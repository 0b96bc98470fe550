#!/usr/bin/env bash
# Building docs/memory.md's largest Gemini model (749M parameters: 26 layers of width 1536, vocabulary
# 8192, bf16 compute, device budget 2 GiB and host budget 12 GiB, placement auto) on one rank: the peak
# memory in use while the model and its Gemini chunks are made, beside the steps' own peak.
# `kuafu-gpt benchmark`, 1 warm-up and 2 timed steps. Plain SGD without momentum keeps no optimizer
# state, so the steps hold only weights, masters and gradients: a build that held more than those (a
# float32 copy of the whole model beside the chunks) shows as peak_in_use_mb above
# steps_peak_in_use_mb, also for a kuafu-gpt that does not report setup_peak_in_use_mb itself.
#
# Usage: [LAYERS=26] benchmarks/gemini_build_peak.sh [build = build] [out = runs/gemini_build_peak]
#                                                   [runs = 1] [kuafu-gpt = <build>/apps/gpt/kuafu-gpt]
# Prints one JSON line per run and keeps each run's log in <out>.
set -euo pipefail
build=${1:-build}
out=${2:-runs/gemini_build_peak}
runs=${3:-1}
app=${4:-$build/apps/gpt/kuafu-gpt}
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
mkdir -p "$out"
config="$(cd "$(dirname "$0")/.." && pwd)/apps/gpt/configs/quickstart.toml"
settings=(--set model.n_layer="${LAYERS:-26}" --set model.n_embd=1536 --set model.n_head=16 --set model.vocab_size=8192
          --set model.n_positions=128 --set data.context=128 --set train.micro_batch_size=4
          --set precision.dtype='"bf16"' --set optim.name='"sgd"' --set optim.momentum=0 --set memory.strategy='"gemini"'
          --set memory.placement='"auto"' --set memory.margin_ratio=0.8 --set memory.device_budget_mb=2048
          --set memory.host_budget_mb=12288 --set benchmark.warmup=1 --set benchmark.steps=2)
for run in $(seq 1 "$runs"); do
  log="$out/run_$run.log"
  if ! /usr/bin/time -v "$app" benchmark --config "$config" "${settings[@]}" > "$log" 2>&1; then
    echo "run $run failed: $(tail -n 3 "$log")" >&2
    continue
  fi
  resident=$(awk -F': ' '/Maximum resident set size/ {print int($2 / 1024)}' "$log")
  grep '^{' "$log" | tail -n 1 | python3 -c '
import json, sys
d = json.load(sys.stdin)
keep = ("parameters", "peak_in_use_mb", "setup_peak_in_use_mb", "steps_peak_in_use_mb", "in_use_before_model_mb",
        "device_peak_mb", "host_peak_mb", "step_time_s")
line = {k: d[k] for k in keep if k in d}
line.update(run=int(sys.argv[1]), layers=int(sys.argv[2]), max_resident_mb=int(sys.argv[3]), binary=sys.argv[4])
print(json.dumps(line))' "$run" "${LAYERS:-26}" "$resident" "$app"
done
