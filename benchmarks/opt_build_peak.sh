#!/usr/bin/env bash
# What building an OPT model costs in host memory against what its steps need (issue 32, item 3): a random
# Hugging Face folder of the published shape (float16, as published; transformers' OPTForCausalLM), then
#   from_folder  `kuafu-opt finetune` from that folder (model.init_from), LoRA r 8 on q_proj and v_proj,
#                bf16, 2 steps: the process's maximum resident set (building and loading included);
#   from_shape   the same run from the shape alone (random weights, no folder): its maximum resident set,
#                the measure of what training itself holds in the same terms;
#   steps        `kuafu-opt benchmark` of the same shape and settings: the steps' own peak in use.
# One JSON line per shape to <out>/build_peak.jsonl. CPU only: the figures are host memory.
# Usage: benchmarks/opt_build_peak.sh [build = build] [out = runs/opt_build_peak] [shapes = "1.3b"]
set -euo pipefail
build=${1:-build}
out=${2:-runs/opt_build_peak}
shapes=${3:-1.3b}
app="$build/apps/opt_finetune/kuafu-opt"
python=.venv/bin/python
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
[[ -x $python ]] || { echo "$python not found: run scripts/setup" >&2; exit 1; }
tokenizer=data/instructions/out/tokenizer
[[ -d $tokenizer ]] || { echo "$tokenizer not found: run apps/opt_finetune/demo.sh first (its step 1 builds it)" >&2; exit 1; }
mkdir -p "$out"
settings=(--set data.context=64 --set lora.rank=8 --set 'lora.targets=["q_proj","v_proj"]' --set 'precision.dtype="bf16"'
          --set train.batch_size=1 --set train.micro_batch_size=1 --set memory.activation_checkpointing=true
          --set 'runtime.device="cpu"')
# The maximum resident set (KiB) of a fresh 2-step fine-tune of `shape` with extra settings; its output
# goes to $out/finetune-<name>.{log,err}.
max_resident_kb() {
  local shape=$1 name=$2
  shift 2
  rm -rf "${out:?}/run-$name"  # a fresh run each time, never a resumed one
  /usr/bin/time -v "$app" finetune --config "apps/opt_finetune/configs/opt-$shape.toml" "${settings[@]}" "$@" \
    --set 'data.kind="instructions"' \
    --set 'data.train="data/instructions/out/train.jsonl"' --set 'data.val="data/instructions/out/val.jsonl"' \
    --set train.steps=2 --set train.eval_interval=0 --set train.eval_rows=1 --set train.checkpoint_interval=0 \
    --set "train.out_dir=\"$out/run-$name\"" > "$out/finetune-$name.log" 2> "$out/finetune-$name.err"
  awk -F': ' '/Maximum resident set size/ {print $2}' "$out/finetune-$name.err"
}
for shape in $shapes; do
  folder="$out/opt-$shape"
  if [[ ! -f $folder/model.safetensors ]]; then
    "$python" - "$shape" "$folder" <<'PY'
import json, sys, torch
from transformers import OPTConfig, OPTForCausalLM
shapes = {"125m": (768, 12, 12), "350m": (1024, 24, 16), "1.3b": (2048, 24, 32), "2.7b": (2560, 32, 32),
          "6.7b": (4096, 32, 32)}
hidden, layers, heads = shapes[sys.argv[1]]
config = OPTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=4 * hidden,
                   vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=hidden)
torch.manual_seed(0)
with torch.no_grad():
    model = OPTForCausalLM(config).half()
model.save_pretrained(sys.argv[2], safe_serialization=True)
PY
    cp "$tokenizer"/* "$folder"/
  fi
  resident_kb=$(max_resident_kb "$shape" "folder-$shape" --set "model.init_from=\"$folder\"")
  shape_kb=$(max_resident_kb "$shape" "shape-$shape" --set "data.tokenizer=\"$tokenizer\"")
  "$app" benchmark --config "apps/opt_finetune/configs/opt-$shape.toml" "${settings[@]}" --set benchmark.warmup=1 \
    --set benchmark.steps=2 > "$out/benchmark-$shape.log"
  python3 - "$shape" "$resident_kb" "$(tail -n 1 "$out/benchmark-$shape.log")" "$shape_kb" <<'PY' | tee -a "$out/build_peak.jsonl"
import json, sys
bench = json.loads(sys.argv[3])
print(json.dumps({"shape": sys.argv[1], "parameters": bench["parameters"], "lora_rank": 8, "precision": "bf16",
                  "from_folder_max_resident_mb": round(int(sys.argv[2]) / 1024, 1),
                  "from_shape_max_resident_mb": round(int(sys.argv[4]) / 1024, 1),
                  "steps_peak_in_use_mb": round(bench["steps_peak_in_use_mb"], 1),
                  "benchmark_peak_in_use_mb": round(bench["peak_in_use_mb"], 1)}))
PY
done
