#!/usr/bin/env bash
# GPU checks and figures on one CUDA machine: trains the quickstart GPT and the small ViT on the GPU
# (fp32 and bf16), times `kuafu-gpt benchmark` against the same step in eager PyTorch on the same torch
# (benchmarks/gpt_eager_pytorch.py), times `kuafu-vit benchmark`, and runs the test binaries with the
# GPU visible. Each result is one JSON line (benchmarks) or a log, written under OUT_DIR.
#
# usage: BIN=build OUT_DIR=out KJV=data/kjv/out FASHION=/usr/share/datasets/fashion-mnist \
#          [PYTHON=python3] [TESTS=1] [REPEATS=3] benchmarks/gpu_figures.sh
set -uo pipefail
BIN=${BIN:-build}
OUT_DIR=${OUT_DIR:-runs/gpu_figures}
KJV=${KJV:-data/kjv/out}
FASHION=${FASHION:-/usr/share/datasets/fashion-mnist}
PYTHON=${PYTHON:-python3}
REPEATS=${REPEATS:-3}
mkdir -p "$OUT_DIR"
gpt=$BIN/apps/gpt/kuafu-gpt
vit=$BIN/apps/vit/kuafu-vit
log() { echo "== $*" >&2; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/gpu.txt"

# 1. End to end on the GPU: the quickstart GPT and the small ViT train, evaluate and (GPT) sample.
for precision in fp32 bf16; do
  run=$OUT_DIR/quickstart_$precision
  log "quickstart GPT, $precision"
  "$gpt" train --config apps/gpt/configs/quickstart.toml --set data.dir=\""$KJV"\" --set data.text=\""$KJV/kjv.txt"\" \
    --set train.out_dir=\""$run"\" --set precision.dtype=\""$precision"\" --set runtime.device=\"cuda\" \
    >"$run.log" 2>&1 || { echo "quickstart $precision failed"; tail -20 "$run.log"; }
  tail -3 "$run.log"
  "$gpt" generate --config apps/gpt/configs/quickstart.toml --set data.dir=\""$KJV"\" \
    --set train.out_dir=\""$run"\" --set runtime.device=\"cuda\" --set generate.max_new_tokens=40 2>&1 | tail -2
done
for precision in fp32 bf16; do
  run=$OUT_DIR/vit_fashion_$precision
  log "ViT Fashion-MNIST, $precision"
  "$vit" train --config apps/vit/configs/fashion_mnist_small.toml --set data.train=\""$FASHION/t10k"\" \
    --set data.val=\""$FASHION/t10k"\" --set train.steps=390 --set train.eval_interval=390 \
    --set train.out_dir=\""$run"\" --set precision.dtype=\""$precision"\" --set runtime.device=\"cuda\" \
    >"$run.log" 2>&1 || { echo "vit $precision failed"; tail -20 "$run.log"; }
  tail -2 "$run.log"
done

# 2. Step times: Kuafu and eager PyTorch alternate, REPEATS times each, so drift affects both alike.
bench() { "$@" 2>>"$OUT_DIR/bench.err" | tail -1 | tee -a "$OUT_DIR/bench.jsonl"; }
for rep in $(seq "$REPEATS"); do
  for precision in fp32 bf16; do
    log "GPT-2 124M, batch 8, $precision, repeat $rep"
    bench "$gpt" benchmark --config apps/gpt/configs/gpt2-124m.toml --set train.micro_batch_size=8 \
      --set precision.dtype=\""$precision"\" --set runtime.device=\"cuda\" --set benchmark.steps=10 --set benchmark.warmup=3
    bench "$PYTHON" benchmarks/gpt_eager_pytorch.py 12 12 768 50257 1024 8 10 16 "$precision" cuda
  done
done
for config in gpt2-355m gpt2-774m gpt2-1.5b; do
  for strategy in none gemini; do
    log "$config bf16, memory $strategy"
    bench "$gpt" benchmark --config "apps/gpt/configs/$config.toml" --set precision.dtype=\"bf16\" \
      --set memory.strategy=\""$strategy"\" --set runtime.device=\"cuda\" --set benchmark.steps=5 --set benchmark.warmup=2
  done
done
for config in vit_b16_imagenet vit_l32_imagenet; do
  for precision in fp32 bf16; do
    log "$config $precision"
    bench "$vit" benchmark --config "apps/vit/configs/$config.toml" --set precision.dtype=\""$precision"\" \
      --set runtime.device=\"cuda\" --set benchmark.steps=10 --set benchmark.warmup=3
  done
done

# The memory strategies through the shared benchmark step (ViT as GPT).
for strategy in zero2 gemini; do
  log "vit_b16_imagenet bf16, memory $strategy, activation checkpointing"
  bench "$vit" benchmark --config apps/vit/configs/vit_b16_imagenet.toml --set precision.dtype=\"bf16\" \
    --set memory.strategy=\""$strategy"\" --set memory.activation_checkpointing=true --set runtime.device=\"cuda\" \
    --set benchmark.steps=10 --set benchmark.warmup=3
done

# 3. The test binaries with the GPU visible (tests that use runtime.device = "auto" run there), each
#    in SHARDS gtest shards side by side.
if [ "${TESTS:-1}" = 1 ]; then
  shards=${SHARDS:-4}
  for t in kuafu_core_tests kuafu_gpt_tests kuafu_vit_tests; do
    for shard in $(seq 0 $((shards - 1))); do
      log "$t shard $shard"
      (GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard timeout "${TEST_TIMEOUT:-300}" "$BIN/tests/$t" \
         >"$OUT_DIR/${t}_$shard.log" 2>&1
       echo "$t shard $shard exit $?" >>"$OUT_DIR/tests_exit.txt") &
    done
  done
  wait
  sort "$OUT_DIR/tests_exit.txt"
  grep -h "^\[  FAILED  \]\|^\[  PASSED  \]" "$OUT_DIR"/kuafu_*_tests_*.log | sort | uniq
fi
