#!/usr/bin/env bash
# The fused paths on a GPU (docs/gpu.md): their tests with the GPU visible, then GPT-2 124M in bf16 at
# micro-batch 32 and 8 with every fused path on and with each turned off in turn (REPEATS times,
# alternating), the all-on step profiled, and OPT-125m (8 x 512) on and off. Lines into
# OUT_DIR/bench.jsonl, a table on stdout.
# usage: BIN=folder-of-binaries OUT_DIR=out [PYTHON=python3] [REPEATS=2] [OPT=1] benchmarks/gpu_fused_paths.sh
set -uo pipefail
BIN=${BIN:-build}
OUT_DIR=${OUT_DIR:-runs/gpu_fused_paths}
PYTHON=${PYTHON:-python3}
REPEATS=${REPEATS:-2}
OPT=${OPT:-1}
mkdir -p "$OUT_DIR"
for tests in "kuafu_core_tests LinearCrossEntropy*:LayerNorm*" \
  "kuafu_gpt_tests GPTModelTest.*:DeviceTest.*:GPTTrainingTest.EveryDeviceTrainsAsTheCpuDoes:GPTTrainingTest.TrainingStaysOnTheConfiguredDevice"; do
  read -r binary filter <<<"$tests"
  [[ -x $BIN/$binary ]] || continue
  timeout 150 "$BIN/$binary" --gtest_filter="$filter" >>"$OUT_DIR/tests.log" 2>&1
done
grep -E '^\[ +(OK|PASSED|FAILED) |Failure' "$OUT_DIR/tests.log" | head -30
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
for rep in $(seq "$REPEATS"); do
  for batch in 32 8; do
    run "gpt2-124m b$batch all fused" "${gpt[@]}" --set train.micro_batch_size=$batch
    run "gpt2-124m b$batch layer_norm off" "${gpt[@]}" --set train.micro_batch_size=$batch --set runtime.fused_layer_norm=false
    run "gpt2-124m b$batch loss off" "${gpt[@]}" --set train.micro_batch_size=$batch --set runtime.fused_loss=false
  done
done
run "gpt2-124m b32 all fused, profiled" "${gpt[@]}" --set train.micro_batch_size=32 --set benchmark.profile_steps=3
if [[ $OPT == 1 && -x $BIN/kuafu-opt ]]; then
  opt=("$BIN/kuafu-opt" benchmark --config apps/opt_finetune/configs/opt-125m.toml --set data.context=512
    --set train.micro_batch_size=8 "${common[@]}")
  for fused in true false; do
    run "opt-125m b8x512 fused=$fused" "${opt[@]}" --set runtime.fused_loss=$fused --set runtime.fused_layer_norm=$fused
  done
fi
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
        for name, ms in p["top"][:20]:
            print("   %7.2f %s" % (ms, name[:90]))
PY
