# What the capacity searches share (sourced by memory_capacity.sh and app_capacity.sh; opt_capacity.sh uses
# capacity_strategy_args alone, chat_capacity.sh capacity_run alone): each memory strategy's overrides, running
# a probe, and whether a probe's benchmark line fits the budgets.
#
# What "fits" means:
#   none, zero2  everything they hold lives on the device: the peak of the bytes allocated beyond what the
#                process held before building the model (the footprint) must fit the device budget;
#   gemini*      the device and host budgets are enforced by Gemini's ledger (a run that would exceed either
#                stops with an error), and the whole footprint, measured as above, must fit device + host
#                (the disk tier's files do not count).
# The footprint counts allocated bytes (sampled every 2 ms on the CPU; CUDA's allocated peak on a GPU), not
# what the allocator keeps for reuse.

# capacity_strategy_args NAME DISK_DIR -> the overrides, one per line
#   gemini_static     every compute shard and master chunk in host memory
#   gemini_auto       auto placement, 80% of the device room the warm-up leaves for masters
#   gemini_disk       as gemini_static, the master chunks the host budget cannot hold on the disk tier
#   gemini_disk_auto  as gemini_auto with the disk tier: the device room takes master chunks off the disk
capacity_strategy_args() {
  local disk="--set memory.disk_dir=\"$2\""
  case $1 in
    none) echo '--set memory.strategy="none"' ;;
    zero2) echo '--set memory.strategy="zero2"' ;;
    gemini_static) echo '--set memory.strategy="gemini" --set memory.offload_param_fraction=1 --set memory.offload_optim_fraction=1' ;;
    gemini_auto) echo '--set memory.strategy="gemini" --set memory.placement="auto" --set memory.margin_ratio=0.8' ;;
    gemini_disk) echo "$(capacity_strategy_args gemini_static "$2") $disk" ;;
    gemini_disk_auto) echo "$(capacity_strategy_args gemini_auto "$2") $disk" ;;
    *) echo "unknown strategy $1" >&2; return 1 ;;
  esac
}

# capacity_run PREFIX LABEL COMMAND... -> runs one probe's benchmark with its output in PREFIX.log and its JSON
# line (the last) in PREFIX.json; exit 0 when it ran. When it stopped, says why on stderr; a refused
# configuration says nothing about size, so it ends the whole search instead of reading as "too large".
capacity_run() {
  local prefix=$1 label=$2
  shift 2
  if ! "$@" > "$prefix.log" 2>&1; then
    rm -f "$prefix.json"
    echo "  $label: stopped: $(tail -n 1 "$prefix.log" | cut -c1-200)" >&2
    if grep -q "invalid configuration" "$prefix.log"; then exit 1; fi
    return 1
  fi
  tail -n 1 "$prefix.log" > "$prefix.json"
}

# capacity_fits JSON STRATEGY DEVICE_MB HOST_MB LABEL -> exit 0 when the benchmark line in JSON fits; says so on stderr
capacity_fits() {
  python3 - "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
name, device, host, label = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
footprint = d["peak_in_use_mb"] - d["in_use_before_model_mb"]
limit = device + host if name.startswith("gemini") else device
fits = footprint <= limit
print(f"  {name}, {label}, {d['parameters'] / 1e6:.0f}M parameters: footprint {footprint:.0f} MiB (limit {limit:.0f}), "
      f"step {d['step_time_ms_median'] / 1e3:.2f} s -> {'fits' if fits else 'too large'}", file=sys.stderr)
sys.exit(0 if fits else 1)
PY
}
