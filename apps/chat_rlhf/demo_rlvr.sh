#!/usr/bin/env bash
# The verifiable-reward demo (docs/chat_rlhf.md, "Rewards a program checks"): reinforcement learning on
# arithmetic, graded by a program, on a tiny Qwen2 trained from random weights on this machine.
#   0. problems and the starting folder (data/arithmetic/build.py: sums of numbers below 100 worked in
#      steps, a ChatML tokenizer folder and a random 0.8M-parameter Qwen2);
#   1. pre-training on worked problems (kuafu-opt, apps/opt_finetune/configs/arith_pretrain.toml), the
#      demo going on from its half-way checkpoint, which still misses some sums;
#   2. SFT on questions in ChatML (configs/rlvr_sft.toml), kept short so the model still misses some;
#   3. GRPO (configs/rlvr_grpo.toml) and 4. PPO (configs/rlvr_ppo.toml), rewarded 1 for an exact answer
#      and 0 otherwise, no reward model, each with two seeds (train.seed 1 and 2);
#   5. held-out figures before and after (exact answers of greedy replies to 500 problems no stage saw),
#      and greedy answers of each model to six held-out problems.
# Writes <out>/summary.json, <out>/transcripts.jsonl and <out>/report/ (scripts/report). Steps already done
# (a folder that exists) are kept. Usage: apps/chat_rlhf/demo_rlvr.sh [build dir = build] [out = runs/rlvr_demo]
set -euo pipefail
build=${1:-build}
out=${2:-runs/rlvr_demo}
chat="$build/apps/chat_rlhf/kuafu-chat"
opt="$build/apps/opt_finetune/kuafu-opt"
configs="$(dirname "$0")/configs"
data=data/arithmetic/out
source "$(dirname "$0")/demo_lib.sh" "$chat" "$opt"

# 0-1. Problems, the random start, pre-training.
[[ -d $data/base_init ]] || "$python" data/arithmetic/build.py "$data"
pcfg="$(dirname "$0")/../opt_finetune/configs/arith_pretrain.toml"
pre=($(at train.out_dir "$out/pretrain"))
if [[ ! -d $out/base ]]; then
  timed pretrain "$opt" prepare --config "$pcfg" "${pre[@]}"
  timed pretrain "$opt" finetune --config "$pcfg" "${pre[@]}"
  "$opt" export --config "$pcfg" "${pre[@]}" --checkpoint "$out/pretrain/checkpoints/step_00000400" --out "$out/base"
fi

# 2. SFT.
sft=($(at model.init_from "$out/base") $(at train.out_dir "$out/sft"))
if [[ ! -d $out/sft_hf ]]; then
  timed sft "$chat" sft --config "$configs/rlvr_sft.toml" "${sft[@]}"
  "$chat" sft export --config "$configs/rlvr_sft.toml" "${sft[@]}" --out "$out/sft_hf"
fi

# 3-4. GRPO and PPO from the SFT folder, two seeds each.
runs=()
for stage in grpo ppo; do
  for seed in 1 2; do
    run=${stage}_seed$seed
    runs+=("$run")
    sets=($(at model.init_from "$out/sft_hf") $(at train.out_dir "$out/$run") --set train.seed=$seed)
    [[ -d $out/$run/checkpoints ]] || timed "$stage" "$chat" "$stage" --config "$configs/rlvr_$stage.toml" "${sets[@]}"
    [[ -d $out/${run}_hf ]] || "$chat" "$stage" export --config "$configs/rlvr_$stage.toml" "${sets[@]}" --out "$out/${run}_hf"
  done
done

# 5. Held-out exact answers before (the SFT weights) and after each run, and transcripts.
line() { "$chat" "$@" | grep '^{' | tail -1; }
evals="{\"sft\": $(line grpo eval --config "$configs/rlvr_grpo.toml" $(at model.init_from "$out/sft_hf") $(at train.out_dir "$out/grpo_seed1") --checkpoint init)"
for run in "${runs[@]}"; do
  stage=${run%_seed*}
  evals+=", \"$run\": $(line "$stage" eval --config "$configs/rlvr_$stage.toml" $(at model.init_from "$out/sft_hf") $(at train.out_dir "$out/$run"))"
done
evals+="}"
: > "$out/transcripts.jsonl"
"$python" -c 'import json, sys; [print(json.loads(l)["prompt"]) for l in list(open(sys.argv[1]))[:6]]' "$data/val.jsonl" |
while IFS= read -r prompt; do
  for model in sft grpo_seed1 ppo_seed1; do
    answer=$("$chat" chat --model "$out/${model}_hf" --prompt "$prompt" --max-new-tokens 40 2>/dev/null)
    "$python" -c 'import json, sys; print(json.dumps({"model": sys.argv[1], "prompt": sys.argv[2], "answer": sys.argv[3]}))' \
      "$model" "$prompt" "$answer" >> "$out/transcripts.jsonl"
  done
done
"$python" - "$out" "$evals" "$data/val.jsonl" "$(declare -p seconds)" <<'PY'
import json, re, sys
out, evals, val = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
seconds = dict(re.findall(r'\[(\w+)\]="?(\d+)"?', sys.argv[4]))
keys = ["val_exact_match", "val_reward", "val_kl", "val_length", "val_eos_rate"]
summary = {"held_out_problems": int(evals["sft"]["prompts"]),
           "models": {name: {k: e[k] for k in keys} for name, e in evals.items()},
           "seconds": {k: int(v) for k, v in seconds.items()}}
open(f"{out}/summary.json", "w").write(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
answers = {json.loads(l)["prompt"]: json.loads(l)["answer"] for l in open(val)}
for line in open(f"{out}/transcripts.jsonl"):
    t = json.loads(line)
    print(f"[{t['model']}] {t['prompt']} -> {t['answer']}   (right answer {answers[t['prompt']]})")
PY

# Curves of every run (loss, reward, held-out exact answers, KL, length): <out>/report/index.html.
scripts/report --out "$out/report" --title "Verifiable-reward demo" "$out/pretrain" "$out/sft" $(printf "$out/%s " "${runs[@]}")
