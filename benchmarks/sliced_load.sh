#!/usr/bin/env bash
# What a tensor-parallel rank reads when it resumes: kuafu-gpt trains 1 step of a 6-layer, width-1536
# GPT (186M parameters, bf16, AdamW) under 1D tensor parallelism over 2 ranks and checkpoints it, then
# resumes from that checkpoint for a second step. Prints the resume's wall time, the largest rank's
# maximum resident memory, and (from its log) what rank 0 read of the checkpoint.
#
# Usage: benchmarks/sliced_load.sh [build = build] [out = runs/sliced_load] [kuafu-gpt = <build>/apps/gpt/kuafu-gpt]
# Needs the quickstart data (kuafu-gpt prepare --config apps/gpt/configs/quickstart.toml).
set -euo pipefail
build=${1:-build}
out=${2:-runs/sliced_load}
app=${3:-$build/apps/gpt/kuafu-gpt}
launcher="$build/tools/kuafu-run"
[[ -x $app && -x $launcher ]] || { echo "$app or $launcher not found: build first (scripts/build)" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out"
config="$(cd "$(dirname "$0")/.." && pwd)/apps/gpt/configs/quickstart.toml"
settings=(--set model.n_layer=6 --set model.n_embd=1536 --set model.n_head=16 --set train.batch_size=4
          --set train.micro_batch_size=4 --set train.checkpoint_interval=1 --set train.eval_interval=1000
          --set train.eval_rows=4 --set precision.dtype='"bf16"' --set optim.name='"adamw"'
          --set parallel.tensor.mode='"1d"' --set parallel.tensor.size=2 --set train.out_dir="\"$out/run\"")
run() {  # steps, log
  /usr/bin/time -f "%e s, max resident %M KiB" -o "$2.time" \
    "$launcher" --nproc-per-node 2 --master-port 0 "$app" train --config "$config" "${settings[@]}" \
    --set train.steps="$1" > "$2" 2>&1 || { echo "failed: $(tail -n 3 "$2")" >&2; exit 1; }
}
run 1 "$out/save.log"
run 2 "$out/resume.log"
echo "resume: $(cat "$out/resume.log.time")"
grep -o "read [0-9]* MiB of weights and optimizer state.*" "$out/resume.log" || echo "(this build does not log what it read)"
du -sm "$out/run/checkpoints/step_00000001" | awk '{print "checkpoint: " $1 " MiB"}'
