#!/usr/bin/env bash
# The chat RLHF demo, end to end on this machine's data (docs/chat_rlhf.md):
#   0. the small OPT that OPT's demo pre-trains from Debian text (apps/opt_finetune/demo.sh's first
#      step: runs/opt_demo/base), and the instruction set (data/instructions/build.py);
#   1. SFT on the instruction set (configs/demo_sft.toml), exported;
#   2. preference pairs (data/preferences/build.py) and the reward model on them (configs/demo_rm.toml),
#      its held-out accuracy per kind beside the word-overlap baseline's, exported;
#   3. PPO (configs/demo_ppo.toml) and 4. GRPO (configs/demo_grpo.toml) against the reward model;
#   5. DPO (configs/demo_dpo.toml) on the pairs;
#   6. held-out figures of each policy (reward, KL to the SFT model, length, EOS rate, answer F1; DPO's
#      preference accuracy) before and after, and greedy answers of every stage's model to five
#      held-out prompts through `kuafu-chat chat --prompt`.
# Writes <out>/summary.json, <out>/transcripts.jsonl and <out>/report/ (scripts/report). Steps already done
# (a folder that exists) are kept.
# Usage: apps/chat_rlhf/demo.sh [build dir = build] [out = runs/chat_demo]
set -euo pipefail
build=${1:-build}
out=${2:-runs/chat_demo}
chat="$build/apps/chat_rlhf/kuafu-chat"
configs="$(dirname "$0")/configs"
source "$(dirname "$0")/demo_lib.sh" "$chat"

# 0. The pre-trained base and the data (OPT's demo makes both; only its first step is needed here).
if [[ ! -d runs/opt_demo/base ]]; then
  opt="$build/apps/opt_finetune/kuafu-opt"
  ocfg="$(dirname "$0")/../opt_finetune/configs/demo_pretrain.toml"
  if [[ ! -f data/instructions/out/pretrain.txt ]]; then
    data/kjv/export.sh data/kjv/out
    python3 data/instructions/build.py data/instructions/out --kjv data/kjv/out/kjv.txt
  fi
  [[ -d data/instructions/out/tokenizer ]] ||
    "$python" data/instructions/train_tokenizer.py data/instructions/out/pretrain.txt data/instructions/out/tokenizer
  timed pretrain "$opt" prepare --config "$ocfg"
  timed pretrain "$opt" finetune --config "$ocfg"
  "$opt" export --config "$ocfg" --out runs/opt_demo/base
fi
[[ -f data/preferences/out/train.jsonl ]] || python3 data/preferences/build.py data/preferences/out

# 1-5. The stages; each exports its folder.
stage() {  # stage config folder
  timed "$1" "$chat" "$1" --config "$2" $(at train.out_dir "$out/$1")
  [[ -d $3 ]] || "$chat" "$1" export --config "$2" $(at train.out_dir "$out/$1") --out "$3"
}
stage sft "$configs/demo_sft.toml" "$out/sft_hf"
stage rm "$configs/demo_rm.toml" "$out/rm_hf"
rl_sets=($(at model.init_from "$out/sft_hf") $(at rl.reward_model "$out/rm_hf"))
for s in ppo grpo; do
  timed "$s" "$chat" "$s" --config "$configs/demo_$s.toml" $(at train.out_dir "$out/$s") "${rl_sets[@]}"
  [[ -d $out/${s}_hf ]] || "$chat" "$s" export --config "$configs/demo_$s.toml" $(at train.out_dir "$out/$s") "${rl_sets[@]}" --out "$out/${s}_hf"
done
timed dpo "$chat" dpo --config "$configs/demo_dpo.toml" $(at train.out_dir "$out/dpo") $(at model.init_from "$out/sft_hf")
[[ -d $out/dpo_hf ]] || "$chat" dpo export --config "$configs/demo_dpo.toml" $(at train.out_dir "$out/dpo") $(at model.init_from "$out/sft_hf") --out "$out/dpo_hf"

# 6. Held-out figures before (the starting weights) and after each stage, and transcripts.
line() { "$chat" "$@" | grep '^{' | tail -1; }
rm_eval=$(line rm eval --config "$configs/demo_rm.toml" $(at train.out_dir "$out/rm") $(at model.init_from "$out/sft_hf"))
rl_before=$(line ppo eval --config "$configs/demo_ppo.toml" $(at train.out_dir "$out/ppo") "${rl_sets[@]}" --checkpoint init)
ppo_after=$(line ppo eval --config "$configs/demo_ppo.toml" $(at train.out_dir "$out/ppo") "${rl_sets[@]}")
grpo_after=$(line grpo eval --config "$configs/demo_grpo.toml" $(at train.out_dir "$out/grpo") "${rl_sets[@]}")
dpo_before=$(line dpo eval --config "$configs/demo_dpo.toml" $(at train.out_dir "$out/dpo") $(at model.init_from "$out/sft_hf") --checkpoint init)
dpo_after=$(line dpo eval --config "$configs/demo_dpo.toml" $(at train.out_dir "$out/dpo") $(at model.init_from "$out/sft_hf"))
prompts=$("$python" - data/instructions/out/val.jsonl <<'PY'
import json, sys
words = [json.loads(l)["prompt"] for l in open(sys.argv[1]) if l.startswith('{"prompt": "What does')]
print("\n".join(words[::len(words) // 5][:5]))
PY
)
: > "$out/transcripts.jsonl"
while IFS= read -r prompt; do
  for model in sft ppo grpo dpo; do
    answer=$("$chat" chat --model "$out/${model}_hf" --prompt "$prompt" --max-new-tokens 40)
    "$python" -c 'import json, sys; print(json.dumps({"model": sys.argv[1], "prompt": sys.argv[2], "answer": sys.argv[3]}))' \
      "$model" "$prompt" "$answer" >> "$out/transcripts.jsonl"
  done
done <<< "$prompts"
"$python" - "$out" "$rm_eval" "$rl_before" "$ppo_after" "$grpo_after" "$dpo_before" "$dpo_after" \
  "$(declare -p seconds)" <<'PY'
import json, re, sys
out = sys.argv[1]
rm, before, ppo, grpo, dpo_before, dpo_after = [json.loads(x) for x in sys.argv[2:8]]
seconds = dict(re.findall(r'\[(\w+)\]="?(\d+)"?', sys.argv[8]))
baseline = json.load(open("data/preferences/out/summary.json"))["overlap_baseline_accuracy"]["val"]
keys = ["val_reward", "val_kl", "val_length", "val_eos_rate", "val_answer_f1"]
summary = {
    "reward_model": {k: v for k, v in rm.items() if k.startswith("val_")},
    "overlap_baseline": baseline,
    "policy": {"sft": {k: before[k] for k in keys}, "ppo": {k: ppo[k] for k in keys}, "grpo": {k: grpo[k] for k in keys}},
    "dpo_preference_accuracy": {"sft": dpo_before["val_accuracy"], "dpo": dpo_after["val_accuracy"]},
    "dpo_likelihood_accuracy": {"sft": dpo_before["val_likelihood_accuracy"], "dpo": dpo_after["val_likelihood_accuracy"]},
    "seconds": {k: int(v) for k, v in seconds.items()},
}
open(f"{out}/summary.json", "w").write(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
for line in open(f"{out}/transcripts.jsonl"):
    t = json.loads(line)
    print(f"[{t['model']}] {t['prompt']} -> {t['answer']}")
PY

# Curves of every stage (loss, reward, KL, length, EOS rate, rate, memory): <out>/report/index.html.
scripts/report --out "$out/report" --title "Chat RLHF demo" "$out/sft" "$out/rm" "$out/ppo" "$out/grpo" "$out/dpo"
