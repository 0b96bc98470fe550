#!/bin/bash
# Before vs after a change: the GPT and ViT benchmark subcommands and 30 training steps of each,
# alternating the two builds, 3 rounds; one JSON line per run into $OUT.
#   git worktree add /tmp/before 4738b29 && ln -s $PWD/.venv /tmp/before/.venv
#   cmake -S /tmp/before -B /tmp/before/build -G Ninja && ninja -C /tmp/before/build kuafu-gpt kuafu-vit
#   BEFORE=/tmp/before/build/apps DATA=<prepared KJV folder> docs/results/architecture/before_after.sh
set -u
export OMP_WAIT_POLICY=passive
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
BEFORE=${BEFORE:-/tmp/before/build/apps}
AFTER=${AFTER:-$ROOT/build/apps}
CFG=$ROOT/apps
DATA=${DATA:-$ROOT/data/kjv/out}
OUT=${OUT:-/tmp/bench/results.jsonl}
mkdir -p /tmp/bench
out=$OUT
: > $out
for round in 1 2 3; do
  for which in before after; do
    bin=$([ $which = before ] && echo $BEFORE || echo $AFTER)
    g=$($bin/gpt/kuafu-gpt benchmark --config $CFG/gpt/configs/quickstart.toml --set data.dir=\"$DATA\" --set runtime.threads=2 2>/dev/null | tail -1)
    echo "{\"which\":\"$which\",\"round\":$round,\"what\":\"gpt_benchmark\",\"line\":$g}" >> $out
    v=$($bin/vit/kuafu-vit benchmark --config $CFG/vit/configs/fashion_mnist_small.toml --set runtime.threads=2 2>/dev/null | tail -1)
    echo "{\"which\":\"$which\",\"round\":$round,\"what\":\"vit_benchmark\",\"line\":$v}" >> $out
    rm -rf /tmp/bench/run_$which
    $bin/gpt/kuafu-gpt train --config $CFG/gpt/configs/quickstart.toml --set data.dir=\"$DATA\" --set runtime.threads=2 \
      --set train.steps=30 --set train.eval_interval=0 --set train.checkpoint_interval=0 --set train.out_dir=\"/tmp/bench/run_$which\" \
      --set train.progress=\"plain\" > /dev/null 2>&1
    python3 - "$which" "$round" /tmp/bench/run_$which/metrics.jsonl >> $out <<'PY'
import json, sys, statistics
which, rnd, path = sys.argv[1:4]
times = [json.loads(l)["step_time_s"] for l in open(path) if '"loss"' in l][5:]
print(json.dumps({"which": which, "round": int(rnd), "what": "gpt_train", "median_step_s": statistics.median(times)}))
PY
    rm -rf /tmp/bench/vrun_$which
    $bin/vit/kuafu-vit train --config $CFG/vit/configs/fashion_mnist_small.toml --set runtime.threads=2 \
      --set train.steps=30 --set train.eval_interval=0 --set train.checkpoint_interval=0 --set train.out_dir=\"/tmp/bench/vrun_$which\" \
      --set train.progress=\"plain\" > /dev/null 2>&1
    python3 - "$which" "$round" /tmp/bench/vrun_$which/metrics.jsonl >> $out <<'PY'
import json, sys, statistics
which, rnd, path = sys.argv[1:4]
times = [json.loads(l)["step_time_s"] for l in open(path) if '"loss"' in l][5:]
print(json.dumps({"which": which, "round": int(rnd), "what": "vit_train", "median_step_s": statistics.median(times)}))
PY
  done
done
