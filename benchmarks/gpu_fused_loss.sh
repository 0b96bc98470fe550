#!/usr/bin/env bash
# The fused loss on a GPU (docs/gpu.md, sixth session): the loss's own tests with the GPU visible, GPT-2
# 124M at micro-batch 32 fused and unfused with the profiler's per-kind split, OPT-125m (8 x 512) fused
# and unfused twice in turn, and GPT-2 at micro-batch 8 profiled. Lines into OUT_DIR/bench.jsonl, a
# table on stdout.
# usage: BIN=folder-of-binaries OUT_DIR=out [PYTHON=python3] benchmarks/gpu_fused_loss.sh
set -uo pipefail
BIN=${BIN:-build}
OUT_DIR=${OUT_DIR:-runs/gpu_fused_loss}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
timeout 100 "$BIN/kuafu_core_tests" --gtest_filter='LinearCrossEntropy*' >"$OUT_DIR/tests.log" 2>&1
grep -E '^\[ +(OK|PASSED|FAILED) |Failure' "$OUT_DIR/tests.log" | head -20
common=(--set 'runtime.device="cuda"' --set 'precision.dtype="bf16"' --set benchmark.steps=10 --set benchmark.warmup=3)
run() {  # label command...: its JSON line under the label
  local label=$1
  shift
  local line
  line=$(timeout 90 "$@" 2>>"$OUT_DIR/err.log" | grep '^{' | tail -1)
  [[ -n $line ]] && echo "{\"label\": \"$label\", \"line\": $line}" >>"$OUT_DIR/bench.jsonl"
  echo "== $label at $SECONDS s" >&2
}
gpt=("$BIN/kuafu-gpt" benchmark --config apps/gpt/configs/gpt2-124m.toml "${common[@]}")
opt=("$BIN/kuafu-opt" benchmark --config apps/opt_finetune/configs/opt-125m.toml --set data.context=512
  --set train.micro_batch_size=8 "${common[@]}")
for fused in true false; do
  run "gpt2-124m b32 fused=$fused profiled" "${gpt[@]}" --set train.micro_batch_size=32 --set benchmark.profile_steps=3 \
    --set runtime.fused_loss=$fused
done
for rep in 1 2; do
  for fused in true false; do run "opt-125m b8x512 fused=$fused" "${opt[@]}" --set runtime.fused_loss=$fused; done
done
run "gpt2-124m b8 fused=true profiled" "${gpt[@]}" --set train.micro_batch_size=8 --set benchmark.profile_steps=3
"$PYTHON" - "$OUT_DIR/bench.jsonl" <<'PY'
import json, sys
for text in open(sys.argv[1]):
    r = json.loads(text)
    x = r["line"]
    print(r["label"], round(x["step_time_ms_median"], 2), "ms", round(x.get("tokens_per_s", 0)), "tokens/s, MFU",
          round(x.get("mfu", 0), 3), "peak", round(x.get("peak_in_use_mb", 0)), "MiB")
    if "profile" in x:
        p = x["profile"]
        print("  ", json.dumps({k: round(v, 2) for k, v in sorted(p["ms_per_step_by_kind"].items(), key=lambda kv: -kv[1])}))
        for name, ms in p["top"][:16]:
            print("   %7.2f %s" % (ms, name[:90]))
PY
