#!/usr/bin/env bash
# Reproduces issue 18's checkpoint/run defects with one build's kuafu-gpt: demo.sh <repo with build/> <label>
repo=$1; label=$2
bin=$repo/build/apps/gpt/kuafu-gpt
cfg=$repo/apps/gpt/configs/quickstart.toml
out=${TMPDIR:-/tmp}/kuafu_reliability/$label; rm -rf $out; mkdir -p $out
common=(--config $cfg --set data.dir=\"${KUAFU_DATA:-data/kjv/out}\" --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2
        --set train.batch_size=8 --set train.micro_batch_size=4 --set train.eval_interval=0 --set train.progress=\"plain\"
        --set runtime.threads=1 --set train.eval_rows=8)
run() { "$bin" train "${common[@]}" "$@" > $out/log 2>&1; echo "exit $?"; }
echo "== 1. latest deleted, step folders present"
run --set train.out_dir=\"$out/r1\" --set train.steps=4 --set train.checkpoint_interval=2 >/dev/null
rm $out/r1/checkpoints/latest
echo "metrics lines before: $(wc -l < $out/r1/metrics.jsonl)"
run --set train.out_dir=\"$out/r1\" --set train.steps=6 --set train.checkpoint_interval=2
grep -E "training|resumed|missing" $out/log | head -3; ls $out/r1/checkpoints
echo "== 2. resume from an older checkpoint with keep_checkpoints=1"
run --set train.out_dir=\"$out/r2\" --set train.steps=4 --set train.checkpoint_interval=1 --set train.keep_checkpoints=3 >/dev/null
run --set train.out_dir=\"$out/r2\" --set train.steps=3 --set train.checkpoint_interval=1 --set train.keep_checkpoints=1 --set train.resume=\"$out/r2/checkpoints/step_00000002\"
ls $out/r2/checkpoints; echo "latest -> $(cat $out/r2/checkpoints/latest)"
echo "== 3. two runs on one out_dir"
"$bin" train "${common[@]}" --set train.out_dir=\"$out/r3\" --set train.steps=100000 > $out/log_a 2>&1 & a=$!
sleep 3
run --set train.out_dir=\"$out/r3\" --set train.steps=3
grep -E "error|in use" $out/log | head -2; kill -INT $a; wait $a; echo "first run exit $?"
echo "== 9. trainer.json step -5 (manifest resealed)"
run --set train.out_dir=\"$out/r9\" --set train.steps=2 >/dev/null
python3 - $out/r9/checkpoints/step_00000002 <<'PY'
import json, os, sys, zlib
d = sys.argv[1]; t = os.path.join(d, "trainer.json")
s = json.load(open(t)); s["step"] = -5; open(t, "w").write(json.dumps(s))
m = json.load(open(os.path.join(d, "manifest.json")))
data = open(t, "rb").read(); m["files"]["trainer.json"] = {"bytes": len(data), "crc32": zlib.crc32(data)}
open(os.path.join(d, "manifest.json"), "w").write(json.dumps(m))
PY
run --set train.out_dir=\"$out/r9\" --set train.steps=4
grep -E "error|lr -" $out/log | head -2
echo "== 11. SIGINT to a single-process run"
"$bin" train "${common[@]}" --set train.out_dir=\"$out/r11\" --set train.steps=100000 > $out/log 2>&1 & p=$!
sleep 3; kill -INT $p; wait $p; echo "exit $?"
echo "== 13. latest linked to a secret file"
mkdir -p $out/r13/checkpoints; echo "root:x:0:0:SECRET-LINE" > $out/secret; ln -s $out/secret $out/r13/checkpoints/latest
run --set train.out_dir=\"$out/r13\" --set train.steps=2
grep -c SECRET-LINE $out/log | sed 's/^/lines echoing the secret: /'; grep error $out/log | cut -c1-200
