#!/usr/bin/env bash
# The largest published OPT shape each fine-tuning strategy runs within a device budget and a host budget
# (issue 19's capacity figure; benchmarks/memory_capacity.sh is GPT's finer-grained one). One rank, bf16
# compute, AdamW, random tokens, micro-batch 1 x CONTEXT tokens, activation checkpointing per block;
# `kuafu-opt benchmark`, 1 warm-up and 2 timed steps per probe. Shapes are tried from the smallest up,
# and a strategy stops at its first shape that does not fit.
#
# What "fits" means:
#   full, lora   everything lives on the device: the peak of the bytes allocated beyond what the process
#                held before building the model must be within the device budget;
#   gemini       Gemini's ledger enforces both budgets (masters and optimizer state offloaded to the
#                host; a run that would exceed either stops with an error).
#   gemini_disk  as gemini, with the master chunks the host budget cannot hold on the disk tier in
#                DISK_DIR (default <out>/disk; its files are scratch, removed when each probe ends).
#
# Usage: benchmarks/opt_capacity.sh [build = build] [device MiB = 24576] [host MiB = 98304] [context = 512]
#                                   [out = runs/opt_capacity] [strategies = "full lora gemini"; gemini_disk too]
#                                   [shapes = "125m 350m 1.3b 2.7b 6.7b 13b"]
set -uo pipefail
build=${1:-build}
device_mb=${2:-24576}
host_mb=${3:-98304}
context=${4:-512}
out=${5:-runs/opt_capacity}
strategies=${6:-"full lora gemini"}
shapes=${7:-"125m 350m 1.3b 2.7b 6.7b 13b"}
app="$build/apps/opt_finetune/kuafu-opt"
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
mkdir -p "$out"
device=${DEVICE:-auto}
disk_dir=$(realpath -m "${DISK_DIR:-$out/disk}")
source "$(dirname "$0")/capacity_probe.sh"

for strategy in $strategies; do
  case $strategy in
    full) args=() ;;
    lora) args=(--set lora.rank=8) ;;
    # The capacity probes' own overrides (capacity_probe.sh: everything offloaded; the disk tier too), under both budgets.
    gemini|gemini_disk) probe=gemini_static
                        [[ $strategy == gemini_disk ]] && { probe=gemini_disk; mkdir -p "$disk_dir"; }
                        read -r -a args <<< "$(capacity_strategy_args "$probe" "$disk_dir")"
                        args+=(--set memory.device_budget_mb="$device_mb" --set memory.host_budget_mb="$host_mb") ;;
    *) echo "unknown strategy '$strategy' (full, lora, gemini or gemini_disk)" >&2; exit 1 ;;
  esac
  largest=none
  for shape in $shapes; do
    log="$out/${strategy}_${shape}.log"
    if ! "$app" benchmark --config "apps/opt_finetune/configs/opt-$shape.toml" --set data.context="$context" \
        --set train.micro_batch_size=1 --set precision.dtype=\"bf16\" --set memory.activation_checkpointing=true \
        --set runtime.device=\""$device"\" --set benchmark.warmup=1 --set benchmark.steps=2 "${args[@]}" > "$log" 2>&1; then
      echo "$strategy $shape: stopped: $(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160)"
      break
    fi
    line=$(tail -n 1 "$log")
    fits=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(int(sys.argv[2].startswith('gemini') or d['peak_in_use_mb'] <= float(sys.argv[3])))" \
           "$line" "$strategy" "$device_mb")
    echo "$line" > "$out/${strategy}_${shape}.json"
    echo "$strategy $shape: $(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(f\"peak {d['peak_in_use_mb']:.0f} MiB, device {d.get('device_peak_mb', d['peak_in_use_mb']):.0f} MiB, host {d.get('host_peak_mb', 0):.0f} MiB, step {d['step_time_ms_median']:.0f} ms, {d['tokens_per_s']:.0f} tokens/s\")" "$line")"
    [[ $fits == 1 ]] || { echo "$strategy $shape: over the device budget"; break; }
    largest=$shape
  done
  echo "$strategy: largest $largest" | tee "$out/${strategy}.largest"
done
