#!/usr/bin/env bash
# Large-batch training on Fashion-MNIST, the essence of Colossal-AI's ViT + LAMB result at this
# machine's scale: the same model (apps/vit/configs/fashion_mnist_small.toml) for the same number of
# epochs with
#   (a) AdamW at batch 128 (the baseline),
#   (b) AdamW at batch 8192 with the learning rate scaled by √(8192/128) = 8 (the usual Adam scaling),
#   (c) LAMB at batch 8192,
#   (d) LARS at batch 8192,
# the large batches reached by gradient accumulation (16 micro-batches of 512). Every run evaluates on
# the 10,000 test images after each epoch. Writes <out>/<run>/metrics.jsonl, <out>/accuracy.csv,
# <out>/summary.md (final test accuracy and wall time) and <out>/accuracy_vs_epoch.svg.
# Usage: apps/vit/reproduce.sh [build dir = build] [epochs = 20] [out = runs/vit_repro] [runs = "a b c d"]
set -euo pipefail
build=${1:-build}
epochs=${2:-20}
out=${3:-runs/vit_repro}
runs=${4:-"a b c d"}
app="$build/apps/vit/kuafu-vit"
config="$(dirname "$0")/configs/fashion_mnist_small.toml"
[[ -x $app ]] || { echo "$app not found: build first (cmake --build $build -j2)" >&2; exit 1; }
mkdir -p "$out"
images=60000

run() {  # name batch micro lr warmup_epochs optimizer [extra overrides...]
  local name=$1 batch=$2 micro=$3 lr=$4 warmup_epochs=$5 optimizer=$6
  shift 6
  local per_epoch=$((images / batch))
  local start end
  rm -rf "${out:?}/$name"
  start=$(date +%s)
  "$app" train --config "$config" --set train.out_dir="\"$out/$name\"" --set train.batch_size="$batch" \
    --set train.micro_batch_size="$micro" --set train.steps=$((per_epoch * epochs)) \
    --set train.eval_interval="$per_epoch" --set train.checkpoint_interval=$((per_epoch * epochs)) \
    --set train.log_interval="$per_epoch" --set train.progress='"plain"' --set optim.name="\"$optimizer\"" \
    --set optim.lr="$lr" --set optim.min_lr=0 --set optim.warmup_steps=$((per_epoch * warmup_epochs)) "$@" \
    > "$out/$name.log" 2>&1
  end=$(date +%s)
  echo "$name $batch $optimizer $lr $per_epoch $((end - start))" >> "$out/runs.txt"
  tail -n 1 "$out/$name.log"
}

rm -f "$out/runs.txt"
for r in $runs; do
  case $r in
    a) run a_adamw_128 128 128 1e-3 1 adamw ;;
    b) run b_adamw_8192 8192 512 8e-3 2 adamw ;;
    c) run c_lamb_8192 8192 512 3e-2 2 lamb ;;  # 1e-2: 67.27%, 3e-2: 74.70%, 6e-2: 72.11% at 20 epochs (docs/vit.md)
    d) run d_lars_8192 8192 512 2.0 2 lars --set optim.weight_decay=5e-4 ;;
  esac
done

# Accuracy per epoch, the summary table and the plot (Python's standard library only).
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
labels = {"a": "AdamW, batch 128", "b": "AdamW, batch 8192 (lr x8)", "c": "LAMB, batch 8192", "d": "LARS, batch 8192"}
runs = []
for line in open(os.path.join(out, "runs.txt")):
    name, batch, optimizer, lr, per_epoch, seconds = line.split()
    curve = []
    for row in open(os.path.join(out, name, "metrics.jsonl")):
        m = json.loads(row)
        if "val_accuracy" in m:
            curve.append((m["step"] / int(per_epoch), 100 * m["val_accuracy"]))
    runs.append((name, labels[name[0]], lr, int(seconds), curve))
with open(os.path.join(out, "accuracy.csv"), "w") as f:
    f.write("run,epoch,test_accuracy\n")
    for name, _, _, _, curve in runs:
        for epoch, acc in curve:
            f.write(f"{name},{epoch:g},{acc:.2f}\n")
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("| run | peak lr | final test accuracy | best | wall time |\n|---|---|---|---|---|\n")
    for name, label, lr, seconds, curve in runs:
        f.write(f"| {label} | {lr} | {curve[-1][1]:.2f}% | {max(a for _, a in curve):.2f}% | {seconds / 60:.1f} min |\n")
# SVG line chart: test accuracy (%) against epochs.
w, h, left, bottom, top, right = 640, 400, 60, 50, 20, 180
epochs = max(e for r in runs for e, _ in r[4])
low = min(a for r in runs for _, a in r[4])
low = max(0, 10 * int(low // 10))
x = lambda e: left + (w - left - right) * e / epochs
y = lambda a: top + (h - top - bottom) * (100 - a) / (100 - low)
colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
       f'<rect width="{w}" height="{h}" fill="white"/>']
for a in range(low, 101, 5 if 100 - low <= 30 else 10):
    svg.append(f'<line x1="{left}" y1="{y(a):.1f}" x2="{w - right}" y2="{y(a):.1f}" stroke="#ddd"/>')
    svg.append(f'<text x="{left - 8}" y="{y(a) + 4:.1f}" text-anchor="end">{a}</text>')
for e in range(0, int(epochs) + 1, max(1, int(epochs) // 10)):
    svg.append(f'<text x="{x(e):.1f}" y="{h - bottom + 18}" text-anchor="middle">{e}</text>')
svg.append(f'<text x="{(left + w - right) / 2}" y="{h - 10}" text-anchor="middle">epoch</text>')
svg.append(f'<text x="15" y="{(top + h - bottom) / 2}" transform="rotate(-90 15 {(top + h - bottom) / 2})" text-anchor="middle">test accuracy (%)</text>')
for i, (name, label, _, _, curve) in enumerate(runs):
    points = " ".join(f"{x(e):.1f},{y(a):.1f}" for e, a in curve)
    svg.append(f'<polyline fill="none" stroke="{colours[i % 4]}" stroke-width="2" points="{points}"/>')
    svg.append(f'<text x="{w - right + 10}" y="{top + 20 + 18 * i}" fill="{colours[i % 4]}">{label}</text>')
svg.append("</svg>")
open(os.path.join(out, "accuracy_vs_epoch.svg"), "w").write("\n".join(svg))
print(open(os.path.join(out, "summary.md")).read())
PY
