#!/bin/bash
# Issue 29's refactor (block sites, the many-model trainer, decoding through the sites) against the
# commit before it: the GPT and OPT benchmark subcommands, alternating the two builds over 3 rounds,
# one JSON line per run into $OUT.
#   git worktree add /tmp/before db38fe3 && ln -s $PWD/.venv /tmp/before/.venv
#   cmake -S /tmp/before -B /tmp/before/build -G Ninja && ninja -C /tmp/before/build kuafu-gpt kuafu-opt
#   docs/results/issue29/before_after.sh
set -eu
export OMP_WAIT_POLICY=passive
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
BEFORE=${BEFORE:-/tmp/before/build/apps}
AFTER=${AFTER:-$ROOT/build/apps}
OUT=${OUT:-$ROOT/docs/results/issue29/before_after.jsonl}
GPT_CONFIG=$ROOT/apps/gpt/configs/quickstart.toml
OPT_CONFIG=$(ls "$ROOT"/apps/opt*/configs/opt-125m.toml | head -1)
: > "$OUT"
for round in 1 2 3; do
  for which in before after; do
    bin=$([ $which = before ] && echo "$BEFORE" || echo "$AFTER")
    g=$("$bin"/gpt/kuafu-gpt benchmark --config "$GPT_CONFIG" --set runtime.threads=2 --set model.vocab_size=8000 \
        --set benchmark.steps=10 2>/dev/null | tail -1)
    echo "{\"which\":\"$which\",\"round\":$round,\"what\":\"gpt_benchmark\",\"line\":$g}" >> "$OUT"
    opt_bin=$(ls -d "$bin"/opt*/ | head -1)
    o=$("$opt_bin"/kuafu-opt benchmark --config "$OPT_CONFIG" --set runtime.threads=2 --set data.context=128 \
        --set train.micro_batch_size=2 --set benchmark.steps=5 2>/dev/null | tail -1)
    echo "{\"which\":\"$which\",\"round\":$round,\"what\":\"opt_benchmark\",\"line\":$o}" >> "$OUT"
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for what in ("gpt_benchmark", "opt_benchmark"):
    ms = {w: [r["line"]["step_time_ms_median"] for r in rows if r["what"] == what and r["which"] == w] for w in ("before", "after")}
    b, a = statistics.median(ms["before"]), statistics.median(ms["after"])
    print(f"{what}: before {', '.join(f'{x:.1f}' for x in ms['before'])} ms; after {', '.join(f'{x:.1f}' for x in ms['after'])} ms; "
          f"median after/before {a / b:.3f}")
PY
