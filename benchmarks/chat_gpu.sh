#!/usr/bin/env bash
# Chat RLHF on one GPU (docs/gpu.md, "Chat RLHF"): every stage on CUDA in bf16 on a slice of the demo's
# data (SFT from scratch, the reward model, PPO, GRPO, DPO, each exported, then `kuafu-chat chat
# --prompt`), and `kuafu-chat benchmark` (a PPO step timed by part) at OPT-125m and OPT-1.3b with the
# actor plain and under Gemini, the reference offloaded or not. JSON lines and logs under OUT_DIR.
#
# usage: CHAT=path/to/kuafu-chat DATA=dir OUT_DIR=out [DEVICE=cuda] [STEPS=20] [SIZES="125m 1.3b"]
#          [VARIANTS="plain gemini_offload"] [PIPELINE=1] [WITHOUT_CACHE=1] [BENCH_TIMEOUT=240]
#          benchmarks/chat_gpu.sh
#   PIPELINE=0 runs only the benchmark (no DATA needed); WITHOUT_CACHE=0 skips its generation without
#   the KV cache (the pass that keeps OPT-1.3b past any time limit).
#   DATA holds tokenizer/, train.jsonl, val.jsonl, train_pairs.jsonl, val_pairs.jsonl (a slice of
#   data/instructions/out and data/preferences/out).
set -uo pipefail
CHAT=${CHAT:-build/apps/chat_rlhf/kuafu-chat}
PIPELINE=${PIPELINE:-1}
[[ $PIPELINE == 0 ]] || DATA=${DATA:?DATA names the data folder}
OUT_DIR=${OUT_DIR:-runs/chat_gpu}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-20}
SIZES=${SIZES-125m 1.3b}
VARIANTS=${VARIANTS:-plain gemini_offload}
WITHOUT_CACHE=${WITHOUT_CACHE:-1}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240}
configs=apps/chat_rlhf/configs
mkdir -p "$OUT_DIR"
log() { echo "== $*" >&2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/gpu.txt"
status=0
if [[ $PIPELINE != 0 ]]; then
run=/tmp/chat_gpu_runs
rm -rf "$run"
on=(--set runtime.device=\""$DEVICE"\" --set precision.dtype=\"bf16\" --set data.tokenizer=\""$DATA/tokenizer"\"
    --set train.steps="$STEPS" --set train.eval_interval=0 --set train.checkpoint_interval=0 --set train.log_interval=5)
step() {  # name command...
  log "$1"
  local t0=$SECONDS
  if "${@:2}" >"$OUT_DIR/$1.log" 2>&1; then echo "{\"stage\": \"$1\", \"ok\": true, \"seconds\": $((SECONDS - t0))}"
  else echo "{\"stage\": \"$1\", \"ok\": false}"; tail -15 "$OUT_DIR/$1.log" >&2; status=1; fi
}

# 1. The pipeline on the GPU.
tiny=(--set model.init_from=\"\" --set model.hidden_size=256 --set model.num_hidden_layers=4 --set model.num_attention_heads=4
      --set model.ffn_dim=1024 --set model.max_position_embeddings=256)
step sft "$CHAT" sft --config $configs/demo_sft.toml "${on[@]}" "${tiny[@]}" --set train.out_dir=\"$run/sft\" \
  --set data.train=\""$DATA/train.jsonl"\" --set data.val=\""$DATA/val.jsonl"\" --set train.eval_rows=64
step sft_export "$CHAT" sft export --config $configs/demo_sft.toml "${on[@]}" "${tiny[@]}" --set train.out_dir=\"$run/sft\" \
  --out "$run/sft_hf"
pairs=(--set data.train=\""$DATA/train_pairs.jsonl"\" --set data.val=\""$DATA/val_pairs.jsonl"\" --set model.init_from=\""$run/sft_hf"\")
step rm "$CHAT" rm --config $configs/demo_rm.toml "${on[@]}" "${pairs[@]}" --set train.out_dir=\"$run/rm\" --set train.eval_rows=128
step rm_eval "$CHAT" rm eval --config $configs/demo_rm.toml "${on[@]}" "${pairs[@]}" --set train.out_dir=\"$run/rm\" --set train.eval_rows=128
step rm_export "$CHAT" rm export --config $configs/demo_rm.toml "${on[@]}" "${pairs[@]}" --set train.out_dir=\"$run/rm\" --out "$run/rm_hf"
rl=(--set data.train=\""$DATA/train.jsonl"\" --set rl.eval_prompts=\""$DATA/val.jsonl"\" --set rl.eval_prompts_count=16
    --set model.init_from=\""$run/sft_hf"\" --set rl.reward_model=\""$run/rm_hf"\")
for s in ppo grpo; do
  step "$s" "$CHAT" "$s" --config $configs/demo_$s.toml "${on[@]}" "${rl[@]}" --set train.out_dir=\"$run/$s\"
  step "${s}_eval" "$CHAT" "$s" eval --config $configs/demo_$s.toml "${on[@]}" "${rl[@]}" --set train.out_dir=\"$run/$s\"
  step "${s}_export" "$CHAT" "$s" export --config $configs/demo_$s.toml "${on[@]}" "${rl[@]}" --set train.out_dir=\"$run/$s\" --out "$run/${s}_hf"
done
step dpo "$CHAT" dpo --config $configs/demo_dpo.toml "${on[@]}" "${pairs[@]}" --set train.out_dir=\"$run/dpo\" --set train.eval_rows=128
step chat "$CHAT" chat --model "$run/ppo_hf" --device "$DEVICE" --prompt "What does harbinger mean?" --max-new-tokens 24
for f in rm_eval ppo_eval grpo_eval chat; do echo "$f: $(grep -v '^\(==\|frozen\|initial\)' "$OUT_DIR/$f.log" | tail -1)"; done
grep -h '"reward"' "$run/ppo/metrics.jsonl" | tail -1 > "$OUT_DIR/ppo_last_step.json"
fi

# 2. A PPO step by part at published shapes: the actor plain or under Gemini, the reference offloaded or not.
bench=(--set runtime.device=\""$DEVICE"\" --set benchmark.steps=5 --set benchmark.warmup=2)
[[ $WITHOUT_CACHE == 0 ]] && bench+=(--set benchmark.generate_without_cache=false)
for size in $SIZES; do
  for variant in $VARIANTS; do
    case $variant in
      plain) sets=(--set memory.strategy=\"none\" --set models.reference.memory.offload_frozen=false) ;;
      gemini) sets=(--set memory.strategy=\"gemini\" --set models.reference.memory.offload_frozen=false) ;;
      gemini_offload) sets=(--set memory.strategy=\"gemini\" --set models.reference.memory.offload_frozen=true) ;;
    esac
    log "benchmark opt-$size $variant"
    if line=$(timeout "$BENCH_TIMEOUT" "$CHAT" benchmark --config $configs/ppo-opt-$size.toml "${bench[@]}" "${sets[@]}" 2>"$OUT_DIR/bench_${size}_$variant.log" | grep '^{'); then
      echo "{\"shape\": \"$size\", \"variant\": \"$variant\", \"line\": $line}" | tee -a "$OUT_DIR/benchmark.jsonl"
    else
      echo "benchmark opt-$size $variant failed"; tail -5 "$OUT_DIR/bench_${size}_$variant.log"; status=1
    fi
  done
done
exit $status
