#!/usr/bin/env bash
# What building the chat stages' models costs in host memory (issue 32, item 3): one training step of
# each stage a user runs, from Hugging Face folders of an OPT of width 1024, 24 layers (302M parameters,
# 1.2 GB in float32; random weights written by transformers), bf16 compute, plain SGD without momentum
# (no optimizer state, so that what the build holds shows against what the steps hold):
#   dpo_lora    DPO, LoRA rank 8 on the attention projections: the frozen base and the reference in bf16;
#   dpo_zero2   DPO, full fine-tuning under ZeRO-2: the policy left described for its shards to fill;
#   rm_zero2    the reward model under ZeRO-2, from the SFT folder;
#   ppo         PPO: a LoRA actor, the critic under ZeRO-2 (from the reward folder), reference and reward
#               model frozen in bf16.
# One JSON line per variant and run: the process's maximum resident set (/usr/bin/time) and the wall
# time. The data (a byte tokenizer, 16 instructions and 16 preference pairs) and the folders are made
# once under <out>/inputs. CPU only: the figures are host memory.
# Usage: benchmarks/chat_build_peak.sh [build = build] [out = runs/chat_build_peak] [runs = 1]
#                                      [kuafu-chat = <build>/apps/chat_rlhf/kuafu-chat] [variants = all four]
set -euo pipefail
build=${1:-build}
out=${2:-runs/chat_build_peak}
runs=${3:-1}
app=${4:-$build/apps/chat_rlhf/kuafu-chat}
variants=${5:-"dpo_lora dpo_zero2 rm_zero2 ppo"}
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
python=.venv/bin/python
[[ -x $python ]] || { echo "$python not found: run scripts/setup" >&2; exit 1; }
inputs="$out/inputs"
mkdir -p "$inputs"
if [[ ! -f $inputs/rm_hf/config.json ]]; then
  "$python" - "$inputs" <<'EOF'
import json, os, sys
import torch
from transformers import OPTConfig, OPTForCausalLM, OPTForSequenceClassification

root = sys.argv[1]
# A byte tokenizer: each byte below 128 one token (GPT-2's byte symbols), OPT's special tokens 0-3.
os.makedirs(f"{root}/tokenizer", exist_ok=True)
def symbol(b):
    return chr(b) if 33 <= b <= 126 else chr(0x100 + b) if b < 33 else chr(0x121)
vocab = {symbol(b): b for b in range(4, 128)}
vocab.update({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3})
json.dump(vocab, open(f"{root}/tokenizer/vocab.json", "w"))
open(f"{root}/tokenizer/merges.txt", "w").write("#version: 0.2\n")
json.dump({"bos_token": "</s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"},
          open(f"{root}/tokenizer/special_tokens_map.json", "w"))
with open(f"{root}/train.jsonl", "w") as instructions, open(f"{root}/pairs.jsonl", "w") as pairs:
    for n in range(16):
        prompt = f"What does w{n} mean?"
        instructions.write(json.dumps({"prompt": prompt, "response": f"a word of {n}."}) + "\n")
        pairs.write(json.dumps({"prompt": prompt, "chosen": f"a word of {n}.", "rejected": "a a a a."}) + "\n")
config = OPTConfig(vocab_size=128, hidden_size=1024, num_hidden_layers=24, ffn_dim=4096, num_attention_heads=16,
                   max_position_embeddings=128, word_embed_proj_dim=1024, pad_token_id=1, bos_token_id=2,
                   eos_token_id=2, dropout=0.0, attention_dropout=0.0)
torch.manual_seed(0)
OPTForCausalLM(config).save_pretrained(f"{root}/sft_hf")
config.num_labels = 1
OPTForSequenceClassification(config).save_pretrained(f"{root}/rm_hf")
EOF
fi
in="$(cd "$inputs" && pwd)"
common="[data]
tokenizer = \"$in/tokenizer\"
context = 64
[train]
steps = 1
batch_size = 2
micro_batch_size = 1
eval_interval = 0
eval_rows = 2
checkpoint_interval = 0
progress = \"plain\"
[precision]
dtype = \"bf16\"
[optim]
name = \"sgd\"
momentum = 0.0
weight_decay = 0.0
lr = 1e-4
warmup_steps = 0
[runtime]
device = \"cpu\"
[model]
init_from = \"$in/sft_hf\"
"
pairs="[data]
train = \"$in/pairs.jsonl\"
val = \"$in/pairs.jsonl\"
"
lora="[lora]
rank = 8
alpha = 16.0
"
zero2="[memory]
strategy = \"zero2\"
"
declare -A stages=([dpo_lora]=dpo [dpo_zero2]=dpo [rm_zero2]=rm [ppo]=ppo)
declare -A texts=(
  [dpo_lora]="$common$pairs$lora"
  [dpo_zero2]="$common$pairs$zero2"
  [rm_zero2]="$common$pairs$zero2"
  [ppo]="$common[data]
train = \"$in/train.jsonl\"
[generate]
max_new_tokens = 8
temperature = 1.0
[rl]
reward_model = \"$in/rm_hf\"
prompts_per_rollout = 2
eval_prompts = \"$in/train.jsonl\"
eval_prompts_count = 2
$lora[models.critic.memory]
strategy = \"zero2\"
"
)
for run in $(seq 1 "$runs"); do
  for variant in $variants; do
    dir="$out/${variant}_$run"
    rm -rf "$dir"
    mkdir -p "$dir"
    # A TOML table may appear once: the sections each variant adds are merged into one file by key.
    "$python" - "$dir/config.toml" "$dir/run" <<EOF
import sys, tomllib
text = """${texts[$variant]}"""
merged = {}
section = None
for line in text.splitlines():
    if line.startswith("["):
        section = line.strip("[]")
        merged.setdefault(section, [])
    elif line.strip():
        merged[section].append(line)
merged["train"].append(f'out_dir = "{sys.argv[2]}"')
out = "\n".join(f"[{s}]\n" + "\n".join(lines) for s, lines in merged.items()) + "\n"
tomllib.loads(out)
open(sys.argv[1], "w").write(out)
EOF
    log="$dir/log"
    start=$(date +%s)
    if ! /usr/bin/time -v "$app" "${stages[$variant]}" --config "$dir/config.toml" > "$log" 2>&1; then
      echo "$variant run $run failed: $(tail -n 3 "$log")" >&2
      continue
    fi
    resident_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
    "$python" -c '
import json, sys
print(json.dumps({"variant": sys.argv[1], "run": int(sys.argv[2]), "max_resident_mb": round(int(sys.argv[3]) / 1024),
                  "wall_s": int(sys.argv[4])}))' "$variant" "$run" "$resident_kb" "$(( $(date +%s) - start ))"
  done
done
