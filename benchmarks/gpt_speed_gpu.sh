#!/usr/bin/env bash
# GPT-2 124M training speed on one GPU (the standing goal of docs/gpu.md): `kuafu-gpt benchmark` in bf16
# against the same step in eager PyTorch and under torch.compile (benchmarks/gpt_eager_pytorch.py, the
# device's own torch), at each micro-batch of BATCHES, REPEATS times in turn so that drift touches all
# three alike. One JSON line per run into OUT_DIR/gpt_speed.jsonl; stops starting runs at DEADLINE s.
#
# UNFUSED=1 adds Kuafu with runtime.fused_loss = false, COMPILE_REPEATS limits the (slow to start)
# torch.compile runs to the first repeats, PADDED=1 adds eager PyTorch with the vocabulary padded to
# 50,304 (aligned products), and PROFILE=1 ends with one profiled eager run per batch (the step's time
# by kind of kernel: benchmarks/gpt_eager_pytorch.py).
#
# usage: GPT=kuafu-gpt OUT_DIR=out [PYTHON=python3] [BATCHES="8 16 32"] [REPEATS=2] [DEADLINE=300]
#          [COMPILE=1] [COMPILE_REPEATS=REPEATS] [UNFUSED=0] [PADDED=0] [PROFILE=0] [PROFILE_BATCHES=BATCHES]
#          [DEVICE=cuda]
#          benchmarks/gpt_speed_gpu.sh
set -uo pipefail
GPT=${GPT:-build/apps/gpt/kuafu-gpt}
OUT_DIR=${OUT_DIR:-runs/gpt_speed_gpu}
PYTHON=${PYTHON:-python3}
BATCHES=${BATCHES:-8 16 32}
REPEATS=${REPEATS:-2}
DEADLINE=${DEADLINE:-300}
COMPILE=${COMPILE:-1}
COMPILE_REPEATS=${COMPILE_REPEATS:-$REPEATS}
UNFUSED=${UNFUSED:-0}
PADDED=${PADDED:-0}
PROFILE=${PROFILE:-0}
PROFILE_BATCHES=${PROFILE_BATCHES:-$BATCHES}
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
kuafu() {  # label batch [--set ...]
  local label=$1 batch=$2
  shift 2
  timed "$label" "$GPT" benchmark --config apps/gpt/configs/gpt2-124m.toml --set train.micro_batch_size="$batch" \
    --set precision.dtype=\"bf16\" --set runtime.device=\"$DEVICE\" --set benchmark.steps=10 --set benchmark.warmup=3 "$@"
}
pytorch() {  # label vocab batch mode
  timed "$1" "$PYTHON" "$here/gpt_eager_pytorch.py" 12 12 768 "$2" 1024 "$3" 10 16 bf16 "$DEVICE" "$4"
}
for rep in $(seq "$REPEATS"); do
  for batch in $BATCHES; do
    kuafu "kuafu b$batch" "$batch"
    [[ $UNFUSED == 1 ]] && kuafu "kuafu unfused b$batch" "$batch" --set runtime.fused_loss=false
    pytorch "eager b$batch" 50257 "$batch" eager
    [[ $PADDED == 1 ]] && pytorch "eager padded b$batch" 50304 "$batch" eager
    [[ $COMPILE == 1 && $rep -le $COMPILE_REPEATS ]] && pytorch "compile b$batch" 50257 "$batch" compile
  done
done
# CUDNN=1: eager with attention on cuDNN's kernel only, once per batch of PROFILE_BATCHES.
if [[ ${CUDNN:-0} == 1 ]]; then
  for batch in $PROFILE_BATCHES; do SDPA_BACKEND=cudnn pytorch "eager cudnn-attention b$batch" 50257 "$batch" eager; done
fi
if [[ $PROFILE == 1 ]]; then
  for batch in $PROFILE_BATCHES; do pytorch "eager profiled b$batch" 50257 "$batch" profile; done
fi
log done
