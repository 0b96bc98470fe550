#!/usr/bin/env bash
# What issues 54 (speed) and 55 (Gemini's disk tier) still need a GPU for, as one prepared run for a
# session that has one (docs/gpu.md "Not checked on a GPU"), in parts so that a call fits its minutes:
#   tests    the tests of the paths built without a GPU, with the GPU visible: the step a CUDA graph
#            captures (DeviceStepTest: host vs device step bitwise, replayed bitwise), decoding graphs
#            (CacheLayoutsTest), attention's named kernels, the fused loss and LayerNorm, GPT on the device
#   speed    GPT-2 124M bf16 at micro-batch 8 and 32: Kuafu plain, with the step as a CUDA graph, with each
#            attention kernel named, against eager PyTorch and torch.compile (gpt_speed_gpu.sh)
#   rollout  OPT-1.3b rollout tokens/s, Kuafu with decoding graphs and without, against transformers'
#            generate with its dynamic and its static cache (chat_generate_transformers.py)
#   capacity the largest OPT that fine-tunes in 24 GiB of GPU and 96 GiB of host, two tiers against three
#            (opt_capacity.sh with DISK_DIR; a 6.7b probe builds on the host first: give it most of a call)
# Everything goes under OUT_DIR; a summary of the test lines and the benchmark lines on stdout.
# BIN: a device bundle's bin/ (benchmarks/pack_device_bundle.sh) or a build folder here.
# usage: BIN=folder-of-binaries OUT_DIR=out [PYTHON=python3] [PARTS="tests speed rollout"] [DEADLINE=420]
#          [DISK_DIR=/tmp/kuafu_disk] benchmarks/speed_gpu_checks.sh
set -uo pipefail
BIN=${BIN:-build}
OUT_DIR=${OUT_DIR:-runs/speed_gpu_checks}
PYTHON=${PYTHON:-python3}
PARTS=${PARTS:-tests speed rollout}
DEADLINE=${DEADLINE:-420}
DISK_DIR=${DISK_DIR:-/tmp/kuafu_disk}
here=$(dirname "$0")
mkdir -p "$OUT_DIR"
log() { echo "== [$SECONDS s] $*" >&2; }
left() { echo $((DEADLINE - SECONDS)); }
has() { [[ " $PARTS " == *" $1 "* ]]; }
binary() {  # NAME: its path in a bundle's flat bin/ or a build's apps/*/ and tests/
  local found
  for found in "$BIN/$1" "$BIN"/apps/*/"$1" "$BIN/tests/$1"; do [[ -x $found ]] && { echo "$found"; return; }; done
  echo "$BIN/$1"
}

if has tests; then
  for tests in "kuafu_core_tests DeviceStepTest.*:AttentionKernelsTest.*:LinearCrossEntropy*:LayerNorm*" \
    "kuafu_opt_tests CacheLayoutsTest.*" \
    "kuafu_gpt_tests GPTModelTest.*:DeviceTest.*:GPTTrainingTest.EveryDeviceTrainsAsTheCpuDoes:GPTCliTest.Benchmark*"; do
    read -r name filter <<<"$tests"
    path=$(binary "$name")
    [[ -x $path ]] || { log "no $name"; continue; }
    log "$name $filter"
    timeout 150 "$path" --gtest_filter="$filter" >>"$OUT_DIR/tests.log" 2>&1
  done
  grep -E '^\[ +(OK|PASSED|FAILED) |Failure' "$OUT_DIR/tests.log" | head -40
fi

if has speed && (($(left) > 60)); then
  log speed
  GPT=$(binary kuafu-gpt) OUT_DIR=$OUT_DIR PYTHON=$PYTHON BATCHES="8 32" REPEATS=1 GRAPHS=1 ATTENTION="flash efficient cudnn" \
    DEADLINE=$(($(left) - 30)) "$here/gpt_speed_gpu.sh"
fi

if has rollout && (($(left) > 60)) && [[ -x $(binary kuafu-chat) ]]; then
  log rollout
  timeout $(($(left) - 10)) "$PYTHON" "$here/chat_generate_transformers.py" --shape 1.3b "$(binary kuafu-chat)" --device cuda \
    --dtype bf16 --rows 64 --new 128 --context 512 --static-cache | tee -a "$OUT_DIR/rollout.jsonl"
fi

if has capacity && (($(left) > 120)); then
  log capacity
  mkdir -p "$DISK_DIR" "$OUT_DIR/layout/apps/opt_finetune"  # opt_capacity.sh looks in a build's layout
  ln -sf "$(realpath "$(binary kuafu-opt)")" "$OUT_DIR/layout/apps/opt_finetune/kuafu-opt"
  DISK_DIR=$DISK_DIR timeout $(($(left) - 10)) "$here/opt_capacity.sh" "$OUT_DIR/layout" 24576 98304 512 "$OUT_DIR/opt_capacity" \
    "gemini gemini_disk" "2.7b 6.7b"
fi

[[ -f $OUT_DIR/gpt_speed.jsonl ]] && "$PYTHON" - "$OUT_DIR/gpt_speed.jsonl" <<'PY'
import json, sys
for text in open(sys.argv[1]):
    r = json.loads(text)
    x = r["line"]
    rate = x.get("tokens_per_s", 0)
    print(r["label"], round(x.get("step_time_ms_median", 0), 2), "ms", round(rate), "tokens/s", "MFU",
          round(x.get("mfu", 0), 3), x.get("attention_kernels", ""), "graphs" if x.get("cuda_graphs") else "")
PY
log done
