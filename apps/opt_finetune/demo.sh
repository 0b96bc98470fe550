#!/usr/bin/env bash
# The OPT fine-tuning demo, end to end on this machine's data (docs/opt.md):
#   1. the instruction set and pre-training text from Debian packages (data/instructions/build.py,
#      with the KJV from data/kjv/export.sh) and a 4,096-token byte-level BPE trained on that text;
#   2. a small OPT pre-trained from scratch on the text (configs/demo_pretrain.toml), exported as a
#      Hugging Face folder: the "pre-trained model" the fine-tunes start from;
#   3. a full fine-tune (configs/demo_finetune.toml) and a LoRA r = 8 fine-tune on q_proj and v_proj
#      (configs/demo_lora.toml) on the instruction set, the loss on the answers only;
#   4. the held-out answer perplexity of the pre-trained model and of both fine-tunes, and greedy answers
#      to five held-out "What does WORD mean?" prompts from each.
# Writes <out>/summary.json, <out>/answers.jsonl and <out>/report/ (scripts/report). Steps already done
# (a folder that exists) are kept.
# Usage: apps/opt_finetune/demo.sh [build dir = build] [out = runs/opt_demo]
set -euo pipefail
build=${1:-build}
out=${2:-runs/opt_demo}
app="$build/apps/opt_finetune/kuafu-opt"
configs="$(dirname "$0")/configs"
data=data/instructions/out
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
python=.venv/bin/python
[[ -x $python ]] || { echo "$python not found: run scripts/setup" >&2; exit 1; }
set_out=(--set "train.out_dir=\"$out/pretrain\"")
start=$(date +%s)

# 1. Data.
if [[ ! -f $data/pretrain.txt ]]; then
  data/kjv/export.sh data/kjv/out
  python3 data/instructions/build.py "$data" --kjv data/kjv/out/kjv.txt
fi
[[ -d $data/tokenizer ]] || "$python" data/instructions/train_tokenizer.py "$data/pretrain.txt" "$data/tokenizer"

# 2. Pre-training, then the base folder the fine-tunes start from.
"$app" prepare --config "$configs/demo_pretrain.toml" "${set_out[@]}"
"$app" finetune --config "$configs/demo_pretrain.toml" "${set_out[@]}"
[[ -d $out/base ]] || "$app" export --config "$configs/demo_pretrain.toml" "${set_out[@]}" --out "$out/base"
pretrained_done=$(date +%s)

# 3. The two fine-tunes.
declare -A seconds
for run in full lora; do
  config="$configs/demo_$([[ $run == full ]] && echo finetune || echo lora).toml"
  t0=$(date +%s)
  "$app" finetune --config "$config" --set "model.init_from=\"$out/base\"" --set "train.out_dir=\"$out/$run\""
  seconds[$run]=$(( $(date +%s) - t0 ))
done

# 4. Answer perplexity and greedy answers.
config_full="$configs/demo_finetune.toml"
eval_line() {  # config run checkpoint
  "$app" eval --config "$1" --set "model.init_from=\"$out/base\"" --set "train.out_dir=\"$out/$2\"" $3 | grep '^{' | tail -1
}
pre=$(eval_line "$config_full" full "--checkpoint init")
full=$(eval_line "$config_full" full "")
lora=$(eval_line "$configs/demo_lora.toml" lora "")
prompts=$("$python" - "$data/val.jsonl" <<'PY'
import json, sys
words = [json.loads(l)["prompt"] for l in open(sys.argv[1]) if l.startswith('{"prompt": "What does')]
print(json.dumps(words[::len(words) // 5][:5]))
PY
)
: > "$out/answers.jsonl"
for run in pretrained full lora; do
  config=$([[ $run == lora ]] && echo "$configs/demo_lora.toml" || echo "$config_full")
  checkpoint=$([[ $run == pretrained ]] && echo "--checkpoint init" || echo "")
  "$app" generate --config "$config" --set "model.init_from=\"$out/base\"" --set "train.out_dir=\"$out/${run/pretrained/full}\"" \
    --set "generate.prompts=$prompts" $checkpoint | grep '^{' | sed "s/^{/{\"model\": \"$run\", /" >> "$out/answers.jsonl"
done
"$python" - "$out" "$pre" "$full" "$lora" "${seconds[full]}" "${seconds[lora]}" "$((pretrained_done - start))" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
out, pre, full, lora = sys.argv[1], *[json.loads(x) for x in sys.argv[2:5]]
full_s, lora_s, pretrain_s, total_s = map(int, sys.argv[5:9])
summary = {
    "answer_perplexity": {"pretrained": pre["val_perplexity"], "full": full["val_perplexity"], "lora": lora["val_perplexity"]},
    "drop_vs_pretrained": {"full": 1 - full["val_perplexity"] / pre["val_perplexity"],
                           "lora": 1 - lora["val_perplexity"] / pre["val_perplexity"]},
    "lora_vs_full": lora["val_perplexity"] / full["val_perplexity"] - 1,
    "answer_tokens": full["tokens"],
    "seconds": {"data_and_pretraining": pretrain_s, "full_finetune": full_s, "lora_finetune": lora_s, "total": total_s},
}
open(f"{out}/summary.json", "w").write(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
for line in open(f"{out}/answers.jsonl"):
    a = json.loads(line)
    print(f"[{a['model']}] {a['prompt']} -> {a['output']}")
PY

# 5. Curves of both fine-tunes (loss, answer perplexity, rate, speed, memory): <out>/report/index.html.
scripts/report --out "$out/report" --title "OPT demo: full fine-tune vs LoRA" "$out/full" "$out/lora"
