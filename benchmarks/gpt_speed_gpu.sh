#!/usr/bin/env bash
# GPT-2 124M training speed on one GPU (the standing goal of docs/gpu.md): `kuafu-gpt benchmark` in bf16
# against the same step in eager PyTorch and under torch.compile (benchmarks/gpt_eager_pytorch.py, the
# device's own torch), at each micro-batch of BATCHES, REPEATS times in turn so that drift touches all
# three alike. One JSON line per run into OUT_DIR/gpt_speed.jsonl; stops starting runs at DEADLINE s.
#
# usage: GPT=kuafu-gpt OUT_DIR=out [PYTHON=python3] [BATCHES="8 16 32"] [REPEATS=2] [DEADLINE=300]
#          [COMPILE=1] [DEVICE=cuda] benchmarks/gpt_speed_gpu.sh
set -uo pipefail
GPT=${GPT:-build/apps/gpt/kuafu-gpt}
OUT_DIR=${OUT_DIR:-runs/gpt_speed_gpu}
PYTHON=${PYTHON:-python3}
BATCHES=${BATCHES:-8 16 32}
REPEATS=${REPEATS:-2}
DEADLINE=${DEADLINE:-300}
COMPILE=${COMPILE:-1}
DEVICE=${DEVICE:-cuda}
here=$(dirname "$0")
mkdir -p "$OUT_DIR"
jsonl=$OUT_DIR/gpt_speed.jsonl
log() { echo "== [$SECONDS s] $*" >&2; }
# label command...: one run within the time left, its last JSON line recorded under the label.
timed() {
  local label=$1 left=$((DEADLINE - SECONDS))
  shift
  ((left > 20)) || { log "skipped $label: deadline"; return; }
  log "$label"
  local line
  line=$(timeout "$left" "$@" 2>>"$OUT_DIR/gpt_speed.err" | grep '^{' | tail -1)
  [[ -n $line ]] && echo "{\"label\": \"$label\", \"line\": $line}" | tee -a "$jsonl" || log "$label: no result"
}
for rep in $(seq "$REPEATS"); do
  for batch in $BATCHES; do
    timed "kuafu b$batch" "$GPT" benchmark --config apps/gpt/configs/gpt2-124m.toml --set train.micro_batch_size="$batch" \
      --set precision.dtype=\"bf16\" --set runtime.device=\"$DEVICE\" --set benchmark.steps=10 --set benchmark.warmup=3
    timed "eager b$batch" "$PYTHON" "$here/gpt_eager_pytorch.py" 12 12 768 50257 1024 "$batch" 10 16 bf16 "$DEVICE" eager
    [[ $COMPILE == 1 ]] && timed "compile b$batch" "$PYTHON" "$here/gpt_eager_pytorch.py" 12 12 768 50257 1024 "$batch" 10 16 bf16 "$DEVICE" compile
  done
done
log done
