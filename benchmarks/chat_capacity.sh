#!/usr/bin/env bash
# The largest PPO actor that trains within a device budget and a host budget, plain against Gemini with the
# frozen models offloaded (issue 30's capacity figure; ColossalChat's "10.3x the model capacity" is the
# anchor). `kuafu-chat benchmark`: one PPO iteration with all four models as a run holds them: actor and
# critic trained (AdamW, bf16 compute), reference and reward model frozen in bf16; random prompts and
# weights; 1 warm-up + 1 timed update after a rollout of 4 prompts x 32 new tokens.
#
# The models: OPT of width 1024 (16 heads, MLP 4096), vocabulary 8192, 128 positions; the four are the
# same shape and only the number of layers changes (12.6M parameters each), found by bisection.
#
# What "trains within the budgets" means (the footprint: the peak of the bytes allocated during the
# rollout and updates beyond what the process held before building the models; building, which makes
# each model in float32 before it is cast and sharded, is reported beside it, not counted: issue 32's
# lazy construction):
#   plain   everything lives on the device: the footprint must fit the device budget;
#   gemini  actor and critic under Gemini with everything offloaded (static placement; each ledger
#           enforces both budgets), reference and reward model in host memory (memory.offload_frozen,
#           brought to the device a block at a time). Host-resident bytes = both ledgers' host peaks + the
#           frozen models' weights (exact tensor sizes, in the line); they must fit the host budget, and
#           the footprint minus them (what a GPU would hold) must fit the device budget.
#   gemini_disk  the same with the reference and reward models' weights in files on the disk tier
#           (memory.disk_dir = OUT/disk, read a block at a time, the next block's read ahead): their host
#           share is then only the blocks being read or computed, counted in the footprint.
#   gemini_all_disk  three tiers for all four: as gemini_disk, and the actor's and critic's master chunks
#           that their host budgets (half the host budget each) cannot hold live on the disk tier too
#           (Gemini's third tier), streamed through host memory for their steps.
# On this CPU-only machine both tiers are host memory: the device side is the measured footprint less
# the host-resident bytes, which also counts host-side temporaries (the optimizer step's) as device, so
# the Gemini figure is conservative. On a GPU the footprint is CUDA's allocated peak: the device alone.
#
# Usage: benchmarks/chat_capacity.sh [build = build] [device MiB = 2048] [host MiB = 12288]
#                                    [out = runs/chat_capacity] [strategies = "plain gemini"; also gemini_disk,
#                                    gemini_all_disk (DISK_FROM: its bisection's lower end, checked; DISK_TOP: upper)]
set -euo pipefail
build=${1:-build}
device_mb=${2:-2048}
host_mb=${3:-12288}
out=${4:-runs/chat_capacity}
strategies=${5:-"plain gemini"}
app="$build/apps/chat_rlhf/kuafu-chat"
[[ -x $app ]] || { echo "$app not found: build first (scripts/build)" >&2; exit 1; }
mkdir -p "$out" "$out/disk"
here=$(dirname "$0")
source "$here/capacity_probe.sh"  # capacity_run; PPO's own strategies and fit rule are below
config="$here/../apps/chat_rlhf/configs/ppo-opt-125m.toml"
common=(--set model.shape='""' --set model.hidden_size=1024 --set model.num_attention_heads=16 --set model.ffn_dim=4096
        --set model.vocab_size=8192 --set model.max_position_embeddings=128 --set data.context=128
        --set generate.max_new_tokens=32 --set rl.prompts_per_rollout=4 --set rl.mini_batches=2 --set train.batch_size=2
        --set train.micro_batch_size=2
        --set precision.dtype='"bf16"' --set optim.name='"adamw"' --set models.critic.precision.dtype='"bf16"'
        --set models.reference.precision.dtype='"bf16"' --set models.reward.precision.dtype='"bf16"'
        --set benchmark.generate_without_cache=false --set benchmark.warmup=1 --set benchmark.steps=1)
gemini=(--set memory.offload_param_fraction=1 --set memory.offload_optim_fraction=1
        --set memory.device_budget_mb="$device_mb" --set memory.host_budget_mb="$host_mb")

strategy_args() {  # name -> overrides
  case $1 in
    plain) echo "--set memory.strategy=\"none\" --set models.critic.memory.strategy=\"none\"
                 --set models.reference.memory.offload_frozen=false --set models.reward.memory.offload_frozen=false" ;;
    gemini) echo "--set memory.strategy=\"gemini\" --set models.critic.memory.strategy=\"gemini\"
                  --set models.critic.memory.offload_param_fraction=1 --set models.critic.memory.offload_optim_fraction=1
                  --set models.critic.memory.device_budget_mb=$device_mb --set models.critic.memory.host_budget_mb=$host_mb
                  --set models.reference.memory.offload_frozen=true --set models.reward.memory.offload_frozen=true" ;;
    gemini_disk) echo "$(strategy_args gemini)
                  --set models.reference.memory.disk_dir=\"$out/disk\" --set models.reward.memory.disk_dir=\"$out/disk\"" ;;
    gemini_all_disk) echo "$(strategy_args gemini_disk)
                  --set memory.disk_dir=\"$out/disk\" --set models.critic.memory.disk_dir=\"$out/disk\"" ;;
  esac
}

# probe strategy layers -> the JSON line in $out/<strategy>_<layers>.json; exit 0 when it fits
probe() {
  local name=$1 layers=$2 file="$out/${1}_${2}.json"
  local args
  read -r -a args <<< "$(strategy_args "$name" | tr '\n' ' ')"
  [[ $name == gemini* ]] && args+=("${gemini[@]}")
  if [[ $name == gemini_all_disk ]]; then  # the two trained models share the host budget
    args+=(--set memory.host_budget_mb=$((host_mb / 2)) --set models.critic.memory.host_budget_mb=$((host_mb / 2)))
  fi
  capacity_run "$out/${name}_${layers}" "$name, $layers layers" \
    "$app" benchmark --config "$config" "${common[@]}" --set model.num_hidden_layers="$layers" "${args[@]}" || return 1
  python3 "$here/chat_capacity_fits.py" "$file" "$name" "$device_mb" "$host_mb"
}

# Bisection on the number of layers: lo fits (or 0), hi does not.
largest() {
  local name=$1 lo=${3:-0} hi=$2 mid
  while (( hi - lo > 1 )); do
    mid=$(( (lo + hi) / 2 ))
    if probe "$name" "$mid"; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}

for name in $strategies; do
  echo "$name:" >&2
  case $name in plain) top=16 ;; gemini_all_disk) top=${DISK_TOP:-64} ;; *) top=32 ;; esac  # 32 layers: host memory of this machine
  from=0
  if [[ $name == gemini_all_disk && -n ${DISK_FROM:-} ]]; then  # a size known to fit, checked first
    probe "$name" "$DISK_FROM" || { echo "gemini_all_disk does not fit DISK_FROM = $DISK_FROM layers" >&2; exit 1; }
    from=$DISK_FROM
  fi
  largest "$name" "$top" "$from" > "$out/$name.largest"
done
python3 "$here/chat_capacity_fits.py" --summary "$out" "$device_mb" "$host_mb"
