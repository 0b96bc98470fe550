#!/usr/bin/env bash
# Two builds of the apps timed against each other on this machine: each app's `benchmark` (GPT's
# quickstart model, OPT-125m, a PPO step at OPT-125m, an SD UNet of the demo's shape), the two builds
# alternated app by app, the build that goes first swapped every round, so that the machine's drift and
# the order fall on both. One JSON line per run: the label,
# the round and the benchmark's own line (step_time_ms_median and memory figures).
#
# Usage: [APPS="gpt opt ppo sd"] benchmarks/apps_before_after.sh BEFORE_DIR AFTER_DIR [rounds = 3] [threads = 2] > lines.jsonl
#   BEFORE_DIR, AFTER_DIR: folders holding kuafu-gpt, kuafu-opt, kuafu-chat and kuafu-sd (copies of
#   build/apps/*/kuafu-* from the two commits). Run from the repository's root.
# Summarise with: python3 benchmarks/apps_before_after_summary.py lines.jsonl
set -euo pipefail
before=$1
after=$2
rounds=${3:-3}
threads=${4:-2}
apps=${APPS:-gpt opt ppo sd}
work=$(mktemp -d /tmp/kuafu_before_after.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The SD benchmark's pipeline: a new one of the emoji demo's init.* shapes, made once by the after build.
"$after/kuafu-sd" init --config apps/stable_diffusion/configs/demo_emoji.toml --out "$work/pipeline" >/dev/null 2>&1

common=(--set "runtime.threads=$threads")
run() {  # label app-binary config extra-args...
  local label=$1 binary=$2 config=$3
  shift 3
  local line
  line=$("$binary" benchmark --config "$config" "${common[@]}" "$@" 2>/dev/null | tail -n 1)
  printf '{"label": "%s", "round": %d, "line": %s}\n' "$label" "$round" "$line"
}

bench() {  # side app
  local dir=${!1}
  case $2 in
    gpt) run "$1 gpt" "$dir/kuafu-gpt" apps/gpt/configs/quickstart.toml --set model.vocab_size=2048 --set benchmark.steps=10 ;;
    opt) run "$1 opt" "$dir/kuafu-opt" apps/opt_finetune/configs/opt-125m.toml --set data.context=128 \
           --set train.micro_batch_size=2 --set train.batch_size=2 --set benchmark.steps=3 ;;
    ppo) run "$1 ppo" "$dir/kuafu-chat" apps/chat_rlhf/configs/ppo-opt-125m.toml --set data.context=128 \
           --set generate.max_new_tokens=32 --set rl.prompts_per_rollout=4 --set train.micro_batch_size=2 --set train.batch_size=2 ;;
    sd) run "$1 sd" "$dir/kuafu-sd" apps/stable_diffusion/configs/demo_emoji.toml --set "model.pipeline=\"$work/pipeline\"" \
          --set benchmark.steps=5 ;;
  esac
}

for ((round = 1; round <= rounds; ++round)); do
  order=(before after)
  ((round % 2 == 0)) && order=(after before)
  for app in $apps; do
    for side in "${order[@]}"; do bench "$side" "$app"; done
  done
done
