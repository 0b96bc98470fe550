#!/usr/bin/env bash
# kuafu-fold on a GPU (issue 52; docs/gpu.md): in order of worth, each part skipped once DEADLINE seconds are
# spent,
#   1. the golden model test (DeepMind's values, loss and every gradient), the chunking test and a training
#      row and a prediction against the CPU's, on CUDA;
#   2. an AlphaFold 2-sized Evoformer block, forward + backward, Kuafu's against OpenFold's PyTorch block
#      (benchmarks/evoformer_block_pytorch.py; PYTHON must import openfold3) in float32 and bf16, alternating;
#   3. a training step of AlphaFold 2 (`kuafu-fold benchmark`, configs/alphafold.toml: crop 256, 128 clusters,
#      1,024 extra rows, 48 blocks, 4 iterations, activation checkpointing) in each of STEP_PRECISIONS;
#   4. `kuafu-fold predict`'s peak GPU memory and time against length: AlphaFold 2's widths, chunked, one
#      Evoformer and one extra-MSA block (blocks run one after another without gradient: the peak is one
#      block's), a random sequence alone, one iteration, the trunk in PREDICT_PRECISION; a length shorter
#      than one that fitted is skipped (LENGTHS="4096 7168 6144" tries 6144 only if 7168 did not fit);
#   5. the tiny config trained on the GPU (DATA: its prepared folder) in float32 and bf16.
# PARTS names the parts to run (default all: "tests block step predict train"). JSON lines go to
# OUT_DIR/fold_gpu.jsonl, logs beside it.
# Usage: BIN=dir (kuafu-fold, evoformer_block, kuafu_fold_tests) OUT_DIR=dir PYTHON=python3 [DEADLINE=420
#        BLOCK_LENGTHS="256 512" LENGTHS="1024 2048 4096 6144" CHUNK=64 PREDICT_PRECISION=fp32
#        STEP_PRECISIONS="bf16 fp32" DATA=data/fastfold_tiny TRAIN_STEPS=300 PARTS=...] benchmarks/fold_gpu.sh
set -uo pipefail
bin=$BIN out=$OUT_DIR py=${PYTHON:-python3}
here="$(cd "$(dirname "$0")" && pwd)"
lines="$out/fold_gpu.jsonl"
begin=$(date +%s)
left() { echo $(( ${DEADLINE:-420} - ($(date +%s) - begin) )); }
note() { echo "$1" | tee -a "$lines"; }
parts=" ${PARTS:-tests block step predict train} "
wanted() { [[ $parts == *" $1 "* ]]; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/# /' | tee -a "$lines"

# 1. The CUDA path against AlphaFold's golden values (float32, and a bf16 trunk), and chunked = whole.
if wanted tests; then
  timeout 150 "$bin/kuafu_fold_tests" --gtest_filter='AlphaFoldModelTest.WithRecyclingIsAlphaFoldsInValueAndLoss:AlphaFoldModelTest.ATrunkInBf16StaysNearAlphaFoldsFloat32:EvoformerBlockTest.*:FoldDeviceTest.*' \
    > "$out/fold_gpu_tests.log" 2>&1
  note "{\"part\": \"tests\", \"rc\": $?, \"seconds\": $(( $(date +%s) - begin ))}"
fi

# 2. One AlphaFold 2-sized block, Kuafu and OpenFold alternating.
wanted block || BLOCK_LENGTHS=" "
for r in ${BLOCK_LENGTHS:-256 512}; do
  for dtype in float32 bf16; do
    (( $(left) > 60 )) || break 2
    timeout 90 "$bin/evoformer_block" --residues "$r" --msa-rows 128 --device cuda --dtype "$dtype" --steps 5 --warmup 2 \
      2>>"$out/fold_gpu_errors.log" | tail -1 | tee -a "$lines"
    timeout 90 "$py" "$here/evoformer_block_pytorch.py" --residues "$r" --msa-rows 128 --device cuda --dtype "$dtype" \
      --steps 5 --warmup 2 2>>"$out/fold_gpu_errors.log" | tail -1 | tee -a "$lines"
  done
done

# 3. AlphaFold 2's training step.
wanted step || STEP_PRECISIONS=" "
for dtype in ${STEP_PRECISIONS:-bf16 fp32}; do
  (( $(left) > 60 )) || break
  timeout "$(left)" "$bin/kuafu-fold" benchmark --config "$here/../apps/fastfold/configs/alphafold.toml" \
    --set runtime.device=cuda --set "precision.dtype=\"$dtype\"" \
    --set benchmark.steps=3 --set benchmark.warmup=1 2> "$out/fold_gpu_benchmark_$dtype.log" | tail -1 | tee -a "$lines"
done

# 4. predict against length, until the time is spent.
printf '[model]\nevoformer_blocks = 1\nextra_msa_blocks = 1\n[data]\nmax_recycles = 0\n' > "$work/predict.toml"
wanted predict || LENGTHS=" "
fitted=0
for n in ${LENGTHS:-1024 2048 4096 6144}; do
  (( $(left) > 45 )) || break
  (( n > fitted )) || continue
  "$py" -c "import random, sys; random.seed($n); print('>random'); print(''.join(random.choice('ACDEFGHIKLMNPQRSTVWY') for _ in range($n)))" \
    > "$work/q.fasta"
  rm -f "$work/q.pdb"
  timeout "$(left)" "$bin/kuafu-fold" predict --config "$work/predict.toml" --set "data.chunk_size=${CHUNK:-64}" \
    --set "precision.dtype=\"${PREDICT_PRECISION:-fp32}\"" --device cuda \
    --fasta "$work/q.fasta" --out "$work/q.pdb" --checkpoint init > "$work/predict.out" 2> "$work/predict.err"
  rc=$?
  if (( rc == 0 )); then
    tail -1 "$work/predict.out" | sed "s/^{/{\"part\": \"predict\", \"chunk_size\": ${CHUNK:-64}, \"precision\": \"${PREDICT_PRECISION:-fp32}\", /" | tee -a "$lines"
    fitted=$n
  else
    note "{\"part\": \"predict\", \"residues\": $n, \"precision\": \"${PREDICT_PRECISION:-fp32}\", \"rc\": $rc, \"error\": $(tail -c 300 "$work/predict.err" | "$py" -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}"
  fi
done

# 5. The tiny config trained on the GPU.
if [ -n "${DATA:-}" ] && wanted train; then
  for dtype in fp32 bf16; do
    (( $(left) > 40 )) || break
    timeout "$(left)" "$bin/kuafu-fold" train --config "$here/../apps/fastfold/configs/tiny.toml" --set "data.dir=\"$DATA\"" \
      --set runtime.device=cuda --set "precision.dtype=\"$dtype\"" --set "train.steps=${TRAIN_STEPS:-300}" \
      --set "train.eval_interval=${TRAIN_STEPS:-300}" --set "train.checkpoint_interval=${TRAIN_STEPS:-300}" \
      --set "train.out_dir=\"$work/run_$dtype\"" > "$out/fold_gpu_train_$dtype.log" 2>&1
    note "{\"part\": \"train\", \"dtype\": \"$dtype\", \"rc\": $?, \"last\": $(grep -E 'eval|val' "$out/fold_gpu_train_$dtype.log" | tail -1 | "$py" -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')}"
  done
fi
note "{\"part\": \"done\", \"seconds\": $(( $(date +%s) - begin ))}"
