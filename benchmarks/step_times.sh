#!/usr/bin/env bash
# One training step's time, one JSON line per measurement: kuafu-gpt benchmark on the quickstart model
# and GPT-2 124M, kuafu-vit benchmark on the small Fashion-MNIST ViT, each in fp32 and bf16, and the same
# GPT steps as an eager PyTorch loop (benchmarks/gpt_eager_pytorch.py) on the venv's torch, which is the
# LibTorch Kuafu links. Run everything in one invocation so the ratios come from one machine state.
#
# Usage: benchmarks/step_times.sh [build = build] [python = .venv/bin/python, "none" to skip]
#                                 [threads = 2] [steps = 10]
# Point `build` at another build (e.g. of an older commit) to compare builds; apps of a build that have
# no benchmark subcommand are reported as missing.
set -euo pipefail
build=${1:-build}
python=${2:-.venv/bin/python}
threads=${3:-2}
steps=${4:-10}
gpt="$build/apps/gpt/kuafu-gpt"
vit="$build/apps/vit/kuafu-vit"
[[ -x $gpt && -x $vit ]] || { echo "$gpt or $vit not found: build first (scripts/build)" >&2; exit 1; }

for precision in fp32 bf16; do
  set_precision=(--set "precision.dtype=\"$precision\"" --set "runtime.threads=$threads")
  "$gpt" benchmark --config apps/gpt/configs/quickstart.toml "${set_precision[@]}" --set "benchmark.steps=$steps" \
    --set model.vocab_size=2048  # the tokenizer's size, without preparing the data
  "$gpt" benchmark --config apps/gpt/configs/gpt2-124m.toml "${set_precision[@]}"
  "$vit" benchmark --config apps/vit/configs/fashion_mnist_small.toml "${set_precision[@]}" --set "benchmark.steps=$steps"
  if [[ $python != none ]]; then
    # LAYERS HEADS WIDTH VOCAB CONTEXT BATCH STEPS THREADS PRECISION, as in the two configs above.
    "$python" benchmarks/gpt_eager_pytorch.py 4 4 256 2048 128 16 "$steps" "$threads" "$precision"
    "$python" benchmarks/gpt_eager_pytorch.py 12 12 768 50257 1024 4 3 "$threads" "$precision"
  fi
done
