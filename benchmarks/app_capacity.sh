#!/usr/bin/env bash
# The largest model of an app that each memory strategy trains within a device and a host budget, with and
# without the disk tier under them (issue 55's capacity search for the apps with a `benchmark`; GPT's own,
# finer one is memory_capacity.sh, PPO's four models chat_capacity.sh). One rank, bf16 compute, AdamW,
# activation checkpointing, random inputs (`<app> benchmark`: 1 warm-up and 2 timed steps per probe). One
# size key grows, found by bisection from 1 up to SIZE_TOP:
#
#   vit   model.num_hidden_layers at ViT-B/32's width (768, 12 heads, MLP 3072), 224 px, micro-batch 8
#   opt   model.num_hidden_layers at OPT-125m's width (768, 12 heads, MLP 3072), micro-batch 2 x 256 tokens
#   fold  model.evoformer_blocks at AlphaFold's widths (c_m 256, c_z 128, alphafold.toml), crops of 48
#         residues, 16 MSA clusters and 32 extra rows, no recycling, no weight average
#   sd    layers_per_block of an SDXL-shaped UNet at small widths (configs/sdxl_small_unet: 64, 128, 256, with
#         1, 2, 4 transformer layers per block; 54M parameters at 2), 32x32 latents, batch 1: each size is a
#         pipeline folder written into <out>/unets
#
# The strategies and what "fits" means: capacity_probe.sh. The three-tier strategies' search starts from the
# two-tier Gemini's largest (which they must fit). EXPECT="gemini_disk=140 none=3 ..." seeds the search with
# an earlier run's sizes: two probes confirm one (it fits, the next size does not); a wrong guess is searched
# on the side where the answer lies.
#
# Usage: [DISK_DIR=...] [SIZE_TOP=...] [EXPECT=...] benchmarks/app_capacity.sh APP [build = build] [device MiB] [host MiB]
#        [out = runs/<app>_capacity] [strategies = "none zero2 gemini_static gemini_auto gemini_disk gemini_disk_auto"]
# The budgets default per app (below) so that every probe runs in minutes on this machine.
set -euo pipefail
name_of_app=${1:?"usage: benchmarks/app_capacity.sh vit|opt|fold|sd [build] [device MiB] [host MiB] [out] [strategies]"}
build=${2:-build}
root="$(dirname "$0")/.."
common=(--set precision.dtype='"bf16"' --set optim.name='"adamw"' --set memory.activation_checkpointing=true
        --set benchmark.warmup=1 --set benchmark.steps=2)
case $name_of_app in
  vit) app="$build/apps/vit/kuafu-vit"; config="$root/apps/vit/configs/vit_b32_imagenet.toml"; key=model.num_hidden_layers
       common+=(--set train.micro_batch_size=8 --set train.batch_size=8); budgets_default=(512 2048); top_default=160; plain_top=16 ;;
  opt) app="$build/apps/opt_finetune/kuafu-opt"; config="$root/apps/opt_finetune/configs/opt-125m.toml"; key=model.num_hidden_layers
       common+=(--set model.shape='""' --set model.vocab_size=50272 --set data.context=256 --set train.micro_batch_size=2 --set train.batch_size=2)
       budgets_default=(1024 4096); top_default=320; plain_top=16 ;;  # three tiers: 237 layers (docs/memory.md)
  fold) app="$build/apps/fastfold/kuafu-fold"; config="$root/apps/fastfold/configs/alphafold.toml"; key=model.evoformer_blocks
        # No weight average (alphafold.toml keeps one), as the searches in docs/memory.md were run.
        common+=(--set data.crop_size=48 --set data.max_msa_clusters=16 --set data.max_extra_msa=32 --set data.max_recycles=0
                 --set train.micro_batch_size=1 --set train.batch_size=1 --set optim.ema_decay=0)
        budgets_default=(512 1024); top_default=320; plain_top=48 ;;  # three tiers: 266 blocks
  sd) app="$build/apps/stable_diffusion/kuafu-sd"; config="$root/apps/stable_diffusion/configs/benchmark_sdxl.toml"; key=model.pipeline
      common+=(--set train.micro_batch_size=1 --set train.batch_size=1); budgets_default=(1024 4096); top_default=32; plain_top=8 ;;
  *) echo "unknown app '$name_of_app' (vit, opt, fold or sd)" >&2; exit 1 ;;
esac
device_mb=${3:-${budgets_default[0]}}
host_mb=${4:-${budgets_default[1]}}
out=${5:-runs/${name_of_app}_capacity}
strategies=${6:-"none zero2 gemini_static gemini_auto gemini_disk gemini_disk_auto"}
top=${SIZE_TOP:-$top_default}
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
mkdir -p "$out"
disk_dir=$(realpath -m "${DISK_DIR:-$out/disk}")
mkdir -p "$disk_dir"
source "$(dirname "$0")/capacity_probe.sh"

# size -> the size key's value (sd: a pipeline folder whose UNet has that many layers per block)
size_value() {
  [[ $name_of_app == sd ]] || { echo "$1"; return; }
  local folder
  folder=$(realpath -m "$out/unets/layers_$1")
  python3 - "$root/apps/stable_diffusion/configs/sdxl_small_unet" "$folder" "$1" <<'PY'
import json, os, shutil, sys
template, folder, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(os.path.join(folder, "unet"), exist_ok=True)
shutil.copy(os.path.join(template, "model_index.json"), folder)
unet = json.load(open(os.path.join(template, "unet", "config.json")))
unet["layers_per_block"] = layers
json.dump(unet, open(os.path.join(folder, "unet", "config.json"), "w"), indent=2)
PY
  echo "\"$folder\""
}

# probe strategy size -> the JSON line in $out/<strategy>_<size>.json; exit 0 when it fits
probe() {
  local name=$1 size=$2 file="$out/${1}_${2}.json" args value
  read -r -a args <<< "$(capacity_strategy_args "$name" "$disk_dir")"
  [[ $name == gemini* ]] && args+=(--set memory.device_budget_mb="$device_mb" --set memory.host_budget_mb="$host_mb")
  value=$(size_value "$size")
  capacity_run "$out/${name}_${size}" "$name, $key = $size" \
    "$app" benchmark --config "$config" "${common[@]}" --set "$key=$value" "${args[@]}" || return 1
  capacity_fits "$file" "$name" "$device_mb" "$host_mb" "$key = $size"
}

# Bisection: lo fits (or 0), hi does not.
largest() {
  local name=$1 lo=$2 hi=$3 mid
  while (( hi - lo > 1 )); do
    mid=$(( (lo + hi) / 2 ))
    if probe "$name" "$mid"; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}

# expected strategy -> the size EXPECT names for it, or nothing
expected() {
  local pair
  for pair in ${EXPECT:-}; do [[ ${pair%%=*} == "$1" ]] && echo "${pair#*=}"; done
  return 0
}

declare -A best
for name in none zero2 gemini_static gemini_auto gemini_disk gemini_disk_auto; do
  if [[ " $strategies " == *" $name "* ]]; then
    echo "$name:" >&2
    from=0
    if [[ $name == gemini_disk* ]]; then
      from=$(( ${best[gemini_static]:-0} > ${best[gemini_auto]:-0} ? ${best[gemini_static]:-0} : ${best[gemini_auto]:-0} ))
      if (( from > 0 )) && ! probe "$name" "$from"; then
        echo "$name does not fit the two tiers' largest ($key = $from)" >&2
        from=0
      fi
    fi
    # Plain and ZeRO-2 have no budget to stop them: a probe builds the whole model, so their search stays low.
    limit=$top
    [[ $name == none || $name == zero2 ]] && limit=$plain_top
    hi=$(( limit + 1 ))
    guess=$(expected "$name")
    if [[ -n $guess ]] && (( guess > from && guess < hi )); then
      if probe "$name" "$guess"; then from=$guess; else hi=$guess; fi
      if (( from == guess && guess + 1 < hi )); then
        if probe "$name" $(( guess + 1 )); then from=$(( guess + 1 )); else hi=$(( guess + 1 )); fi
      fi
    fi
    (( hi > from )) && largest "$name" "$from" "$hi" > "$out/$name.largest"
  fi
  [[ -f $out/$name.largest ]] && best[$name]=$(cat "$out/$name.largest")
done

found=()
for name in none zero2 gemini_static gemini_auto gemini_disk gemini_disk_auto; do
  [[ -n ${best[$name]:-} ]] && found+=("$name=${best[$name]}")
done
python3 - "$out" "$device_mb" "$host_mb" "$key" "$top" "$plain_top" "${found[@]}" <<'PY'
import json, os, sys
out, device, host, key = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
top, plain_top = int(sys.argv[5]), int(sys.argv[6])
sizes = {n: int(s) for n, s in (a.split("=") for a in sys.argv[7:])}
labels = {"none": "plain", "zero2": "ZeRO-2", "gemini_static": "Gemini static, two tiers",
          "gemini_auto": "Gemini auto, two tiers", "gemini_disk": "Gemini static + disk tier",
          "gemini_disk_auto": "Gemini auto + disk tier"}
lines = {n: json.load(open(os.path.join(out, f"{n}_{s}.json"))) for n, s in sizes.items() if s > 0}
plain = lines["none"]["parameters"] if "none" in lines else None
key = "UNet layers per block" if key == "model.pipeline" else key
rows = [f"| strategy | largest ({key}) | parameters | vs plain | footprint | device peak | host peak | master chunks on disk | step |",
        "|---|---|---|---|---|---|---|---|---|"]
for n, s in sizes.items():
    if s == 0:
        rows.append(f"| {labels[n]} | none fits | | | | | | | |")
        continue
    d = lines[n]
    footprint = d["peak_in_use_mb"] - d["in_use_before_model_mb"]
    largest = f"{s}" + (" (the search's top)" if s == top or (n in ("none", "zero2") and s == plain_top) else "")
    ratio = f"{d['parameters'] / plain:.1f}x" if plain else ""
    cell = lambda k: f"{d[k]:.0f} MiB" if k in d else "-"
    disk = f"{d['master_chunks_on_disk']:.0f}" if "master_chunks_on_disk" in d else "-"
    rows.append(f"| {labels[n]} | {largest} | {d['parameters'] / 1e6:.1f}M | {ratio} | {footprint:.0f} MiB | "
                f"{cell('device_peak_mb')} | {cell('host_peak_mb')} | {disk} | {d['step_time_ms_median'] / 1e3:.2f} s |")
text = f"Budgets: device {device:.0f} MiB, host {host:.0f} MiB, disk unlimited.\n\n" + "\n".join(rows) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
print(text)
PY
