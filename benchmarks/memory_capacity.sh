#!/usr/bin/env bash
# The largest GPT each memory strategy trains within a device budget and a host budget, and the step
# time of each at a size all of them run (issue 7's benchmark). One rank, bf16 compute, AdamW, random
# tokens (kuafu-gpt benchmark: 1 warm-up step + 2 timed steps per probe, 2 + 5 for the step times).
#
# The models: width 1536 (16 heads), vocabulary 8192, 128 positions, micro-batch 4 x 128 tokens; only
# the number of layers changes (28.3M parameters each), found by bisection.
#
# The strategies (none, zero2, gemini_static, gemini_auto, and with the disk tier gemini_disk and
# gemini_disk_auto, whose files go to DISK_DIR, default <out>/disk) and what "trains within the budgets"
# means are in capacity_probe.sh. On this CPU-only machine both tiers are host memory: the device budget is
# enforced by accounting.
#
# Usage: [CHECKPOINTING=1] [DISK_DIR=...] [DISK_TOP=160] benchmarks/memory_capacity.sh [build = build] [device MiB = 2048] [host MiB = 12288]
#                                       [out = runs/memory_capacity] [strategies = the first four]
# Strategies left out keep the largest size found by an earlier run (<out>/<strategy>.largest); gemini_disk's (and
# gemini_disk_auto's) bisection starts from the larger two-tier Gemini's largest (which it must fit) up to DISK_TOP layers (160).
set -euo pipefail
build=${1:-build}
device_mb=${2:-2048}
host_mb=${3:-12288}
out=${4:-runs/memory_capacity}
strategies=${5:-"none zero2 gemini_static gemini_auto"}
app="$build/apps/gpt/kuafu-gpt"
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
mkdir -p "$out"
config="$(dirname "$0")/../apps/gpt/configs/quickstart.toml"
common=(--set model.n_embd=1536 --set model.n_head=16 --set model.vocab_size=8192 --set model.n_positions=128
        --set data.context=128 --set train.micro_batch_size=4 --set precision.dtype='"bf16"' --set optim.name='"adamw"')
# CHECKPOINTING=1: every strategy recomputes its blocks' activations in backward (memory.activation_checkpointing).
[[ ${CHECKPOINTING:-0} == 1 ]] && common+=(--set memory.activation_checkpointing=true)
budgets=(--set memory.device_budget_mb="$device_mb" --set memory.host_budget_mb="$host_mb")
disk_dir=$(realpath -m "${DISK_DIR:-$out/disk}")
mkdir -p "$disk_dir"

source "$(dirname "$0")/capacity_probe.sh"

# probe strategy layers warmup steps -> the JSON line in $out/<strategy>_<layers>.json; exit 0 when it fits
probe() {
  local name=$1 layers=$2 warmup=$3 steps=$4 file="$out/${1}_${2}.json"
  local args
  read -r -a args <<< "$(capacity_strategy_args "$name" "$disk_dir")"
  [[ $name == gemini* ]] && args+=("${budgets[@]}")
  capacity_run "$out/${name}_${layers}" "$name, $layers layers" "$app" benchmark --config "$config" "${common[@]}" \
    --set model.n_layer="$layers" "${args[@]}" --set benchmark.warmup="$warmup" --set benchmark.steps="$steps" || return 1
  capacity_fits "$file" "$name" "$device_mb" "$host_mb" "$layers layers"
}

# Bisection on the number of layers: lo fits (or 0), hi does not.
largest() {
  local name=$1 lo=${3:-0} hi=$2 mid
  while (( hi - lo > 1 )); do
    mid=$(( (lo + hi) / 2 ))
    if probe "$name" "$mid" 1 2; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}

declare -A best
for name in none zero2 gemini_static gemini_auto gemini_disk gemini_disk_auto; do
  if [[ " $strategies " == *" $name "* ]]; then
    echo "$name:" >&2
    from=0
    case $name in none|zero2) top=12 ;; gemini_disk*) top=${DISK_TOP:-160} ;; *) top=34 ;; esac
    if [[ $name == gemini_disk* ]]; then
      from=$(( ${best[gemini_static]:-0} > ${best[gemini_auto]:-0} ? ${best[gemini_static]:-0} : ${best[gemini_auto]:-0} ))
      probe "$name" "$from" 1 2 || { echo "$name does not fit the two tiers' largest ($from layers)" >&2; exit 1; }
    fi
    largest "$name" "$top" "$from" > "$out/$name.largest"
  fi
  [[ -f $out/$name.largest ]] && best[$name]=$(cat "$out/$name.largest")
done

# Step times at the size plain data parallelism reaches (all four run it), when plain was searched or kept.
common_layers=${best[none]:-0}
if [[ -n ${best[none]:-} ]]; then
  (( common_layers >= 1 )) || { echo "plain data parallelism fits no model in $device_mb MiB" >&2; exit 1; }
  echo "step times at $common_layers layers:" >&2
  for name in none zero2 gemini_static gemini_auto; do  # all four in one run: their ratios compare
    probe "$name" "$common_layers" 2 5 || true
    cp "$out/${name}_${common_layers}.json" "$out/${name}_common.json" 2>/dev/null || true
  done
else
  echo "no plain run: no step times at a common size, no ratios to plain" >&2
fi

found=()
for name in none zero2 gemini_static gemini_auto gemini_disk gemini_disk_auto; do [[ -n ${best[$name]:-} ]] && found+=("$name=${best[$name]}"); done
python3 - "$out" "$device_mb" "$host_mb" "${found[@]}" <<'PY'
import json, os, sys
out, device, host = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
layers = {n: int(l) for n, l in (a.split("=") for a in sys.argv[4:])}
labels = {"none": "plain data parallelism", "zero2": "ZeRO-2", "gemini_static": "Gemini static (all offloaded)",
          "gemini_auto": "Gemini auto (margin 0.8)", "gemini_disk": "Gemini static + disk tier (three tiers)",
          "gemini_disk_auto": "Gemini auto + disk tier (three tiers)"}
bytes_per_param = 18  # Gemini: bf16 weights 2 + float32 master 4 + gradient 4 + Adam moments 8
bound = (device + host) * 2**20 / bytes_per_param
common = {n: json.load(open(os.path.join(out, f"{n}_common.json"))) for n in layers
          if os.path.exists(os.path.join(out, f"{n}_common.json"))}
# Without plain's run (its strategies not asked for), the columns against plain stay empty.
plain_params = json.load(open(os.path.join(out, f"none_{layers['none']}.json")))["parameters"] if "none" in layers else float("nan")
plain_time = common["none"]["step_time_ms_median"] if "none" in common else float("nan")
common_size = f"{common['none']['parameters'] / 1e6:.0f}M" if "none" in common else "plain's largest"
rows = ["| strategy | largest model | vs plain | vs bound | footprint | device peak | host peak | step time at "
        f"{common_size} | vs plain |", "|---|---|---|---|---|---|---|---|---|"]
for n, l in layers.items():
    d = json.load(open(os.path.join(out, f"{n}_{l}.json")))
    footprint = d["peak_in_use_mb"] - d["in_use_before_model_mb"]
    dev = f"{d['device_peak_mb']:.0f} MiB" if "device_peak_mb" in d else "(all)"
    hst = f"{d['host_peak_mb']:.0f} MiB" if "host_peak_mb" in d else "-"
    t = common[n]["step_time_ms_median"] if n in common else float("nan")
    vs_plain = d["parameters"] / plain_params
    shown = lambda value, text: "-" if value != value else text  # NaN: not measured (no plain run)
    rows.append(f"| {labels[n]} | {d['parameters'] / 1e6:.0f}M ({l} layers) | {shown(vs_plain, f'{vs_plain:.1f}x')} | "
                f"{d['parameters'] / bound:.0%} | {footprint:.0f} MiB | {dev} | {hst} | {shown(t, f'{t / 1e3:.2f} s')} | "
                f"{shown(t / plain_time, f'{t / plain_time:.2f}x')} |")
two_tiers = [n for n in ("gemini_static", "gemini_auto") if n in layers]
if "gemini_disk" in layers and two_tiers:
    d = json.load(open(os.path.join(out, f"gemini_disk_{layers['gemini_disk']}.json")))
    two = max(json.load(open(os.path.join(out, f"{n}_{layers[n]}.json")))["parameters"] for n in two_tiers)
    rows.append(f"\nThree tiers against two: {d['parameters'] / two:.1f}x the parameters; at the largest, "
                f"{d.get('master_chunks_on_disk', 0):.0f} master chunks on the disk ({d.get('disk_peak_mb', 0) / 1024:.1f} GiB of "
                f"files, {d.get('disk_read_gb', 0):.1f} GB read and {d.get('disk_written_gb', 0):.1f} GB written over the run, "
                f"{d.get('disk_wait_s', 0):.1f} s waited for the disk), step {d['step_time_ms_median'] / 1e3:.1f} s.")
text = (f"Budgets: device {device:.0f} MiB, host {host:.0f} MiB. Bound (device + host) / {bytes_per_param} bytes per "
        f"parameter = {bound / 1e6:.0f}M parameters.\n\n" + "\n".join(rows) + "\n")
open(os.path.join(out, "summary.md"), "w").write(text)
print(text)
PY
