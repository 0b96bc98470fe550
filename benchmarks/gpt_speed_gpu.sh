#!/usr/bin/env bash
# GPT-2 124M training speed on one GPU (the standing goal of docs/gpu.md): `kuafu-gpt benchmark` in bf16
# against the same step in eager PyTorch and under torch.compile (benchmarks/gpt_eager_pytorch.py, the
# device's own torch), at each micro-batch of BATCHES, REPEATS times in turn so that drift touches all
# three alike. One JSON line per run into OUT_DIR/gpt_speed.jsonl; stops starting runs at DEADLINE s.
#
# UNFUSED=1 adds Kuafu with runtime.fused_loss and runtime.fused_layer_norm = false; MKL=1 adds Kuafu with
# runtime.cpu_blas = "libtorch" (the CPU's float32 products on LibTorch's MKL, not OpenBLAS); MKL_VENDOR=1
# adds Kuafu with runtime.mkl_kernels = "vendor" (MKL's generic kernels on AMD processors); COMPILE_REPEATS
# limits the (slow to start) torch.compile runs to the first repeats; PADDED=1 adds eager PyTorch with
# the vocabulary padded to a multiple of 64 (50,304 for GPT-2: aligned products); PROFILE=1 ends with one
# profiled eager run per batch (the step's time by kind of kernel: benchmarks/gpt_eager_pytorch.py);
# ATTENTION="flash cudnn ..." adds Kuafu with each runtime.attention_backend named (the line's
# attention_kernels says which kernels ran); GRAPHS=1 adds Kuafu with the step captured as a CUDA graph
# (benchmark.cuda_graphs).
#
# Another model or device: CONFIG (Kuafu's config) and SHAPE ("LAYERS HEADS WIDTH VOCAB CONTEXT", the
# same model for PyTorch), SETS (more --set options for Kuafu, e.g. the config's vocabulary), PRECISION
# and THREADS (PyTorch's; Kuafu takes runtime.threads from SETS). On the CPU:
#   DEVICE=cpu PRECISION=fp32 THREADS=2 CONFIG=apps/gpt/configs/quickstart.toml SHAPE="4 4 256 2048 128" \
#     SETS="--set model.vocab_size=2048 --set runtime.threads=2" BATCHES=16 PYTHON=.venv/bin/python ...
#
# STEPS: timed steps per run (10; more where a noisy machine needs them).
#
# usage: GPT=kuafu-gpt OUT_DIR=out [PYTHON=python3] [BATCHES="8 16 32"] [REPEATS=2] [STEPS=10] [DEADLINE=300]
#          [COMPILE=1] [COMPILE_REPEATS=REPEATS] [UNFUSED=0] [MKL=0] [MKL_VENDOR=0] [PADDED=0] [PROFILE=0] [PROFILE_BATCHES=BATCHES]
#          [ATTENTION="flash efficient cudnn math"] [GRAPHS=0]
#          [DEVICE=cuda] [CONFIG=...] [SHAPE=...] [SETS=...] [PRECISION=bf16] [THREADS=16]
#          benchmarks/gpt_speed_gpu.sh
set -uo pipefail
GPT=${GPT:-build/apps/gpt/kuafu-gpt}
OUT_DIR=${OUT_DIR:-runs/gpt_speed_gpu}
PYTHON=${PYTHON:-python3}
BATCHES=${BATCHES:-8 16 32}
REPEATS=${REPEATS:-2}
STEPS=${STEPS:-10}
DEADLINE=${DEADLINE:-300}
COMPILE=${COMPILE:-1}
COMPILE_REPEATS=${COMPILE_REPEATS:-$REPEATS}
UNFUSED=${UNFUSED:-0}
MKL=${MKL:-0}
PADDED=${PADDED:-0}
PROFILE=${PROFILE:-0}
PROFILE_BATCHES=${PROFILE_BATCHES:-$BATCHES}
DEVICE=${DEVICE:-cuda}
CONFIG=${CONFIG:-apps/gpt/configs/gpt2-124m.toml}
SHAPE=${SHAPE:-12 12 768 50257 1024}
read -r -a sets <<<"${SETS:-}"
PRECISION=${PRECISION:-bf16}
THREADS=${THREADS:-16}
read -r layers heads width vocab context <<<"$SHAPE"
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
  timed "$label" "$GPT" benchmark --config "$CONFIG" --set train.micro_batch_size="$batch" \
    --set precision.dtype=\"$PRECISION\" --set runtime.device=\"$DEVICE\" --set benchmark.steps="$STEPS" --set benchmark.warmup=3 \
    ${sets[@]+"${sets[@]}"} "$@"
}
pytorch() {  # label vocab batch mode
  timed "$1" "$PYTHON" "$here/gpt_eager_pytorch.py" "$layers" "$heads" "$width" "$2" "$context" "$3" "$STEPS" "$THREADS" \
    "$PRECISION" "$DEVICE" "$4"
}
for rep in $(seq "$REPEATS"); do
  for batch in $BATCHES; do
    kuafu "kuafu b$batch" "$batch"
    [[ $UNFUSED == 1 ]] && kuafu "kuafu unfused b$batch" "$batch" --set runtime.fused_loss=false --set runtime.fused_layer_norm=false
    [[ $MKL == 1 ]] && kuafu "kuafu mkl b$batch" "$batch" --set runtime.cpu_blas=\"libtorch\"
    [[ ${MKL_VENDOR:-0} == 1 ]] && kuafu "kuafu mkl-vendor b$batch" "$batch" --set runtime.mkl_kernels=\"vendor\"
    [[ ${GRAPHS:-0} == 1 ]] && kuafu "kuafu graphs b$batch" "$batch" --set benchmark.cuda_graphs=true
    for backend in ${ATTENTION:-}; do kuafu "kuafu $backend-attention b$batch" "$batch" --set runtime.attention_backend=\"$backend\"; done
    pytorch "eager b$batch" "$vocab" "$batch" eager
    [[ $PADDED == 1 ]] && pytorch "eager padded b$batch" $(((vocab + 63) / 64 * 64)) "$batch" eager
    [[ $COMPILE == 1 && $rep -le $COMPILE_REPEATS ]] && pytorch "compile b$batch" "$vocab" "$batch" compile
  done
done
# CUDNN=1: eager with attention on cuDNN's kernel only, once per batch of PROFILE_BATCHES.
if [[ ${CUDNN:-0} == 1 ]]; then
  for batch in $PROFILE_BATCHES; do SDPA_BACKEND=cudnn pytorch "eager cudnn-attention b$batch" "$vocab" "$batch" eager; done
fi
if [[ $PROFILE == 1 ]]; then
  for batch in $PROFILE_BATCHES; do pytorch "eager profiled b$batch" "$vocab" "$batch" profile; done
fi
log done
