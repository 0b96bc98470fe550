#!/usr/bin/env bash
# Byte-level BPE encoding speed, Kuafu vs Hugging Face `tokenizers` on the same text in one run: the
# King James Bible (data/kjv/export.sh, 4.2 MB) with the 2,000-token tokenizer tests/python/bpe_reference.py
# trains. Both encode the whole text as one string on one thread, from a cold cache, 3 times (median);
# the checksums of the ids must agree. `tokenizers` also encodes the text as a batch of lines (its usual
# use; one thread), which cuts the text differently (no checksum). Usage: benchmarks/bpe_tokenizer_speed.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
data/kjv/export.sh "$work/kjv" > /dev/null
.venv/bin/python tests/python/bpe_reference.py build "$work/kjv/kjv.txt" "$work/tok" > /dev/null
"$build/benchmarks/bpe_tokenizer_speed" "$work/tok/tokenizer.json" "$work/kjv/kjv.txt" 3
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false .venv/bin/python - "$work/tok/tokenizer.json" "$work/kjv/kjv.txt" <<'PY'
import json, statistics, sys, time
from tokenizers import Tokenizer
text = open(sys.argv[2], encoding="utf-8").read()
seconds = []
for _ in range(3):
    tokenizer = Tokenizer.from_file(sys.argv[1])  # a cold cache each time, as Kuafu's
    start = time.perf_counter()
    ids = tokenizer.encode(text).ids
    seconds.append(time.perf_counter() - start)
checksum = 0
for i in ids:
    checksum = (checksum * 31 + i + 1) % 1000000007
mb = len(text.encode("utf-8")) / 1e6
print(json.dumps({"implementation": "tokenizers", "megabytes": mb, "tokens": len(ids),
                  "mb_per_s_median": mb / statistics.median(seconds), "mb_per_s_best": mb / min(seconds),
                  "checksum": checksum}))
lines = text.splitlines(keepends=True)
seconds = []
for _ in range(3):
    tokenizer = Tokenizer.from_file(sys.argv[1])
    start = time.perf_counter()
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(lines))
    seconds.append(time.perf_counter() - start)
print(json.dumps({"implementation": "tokenizers, batch of lines", "megabytes": mb, "tokens": tokens,
                  "mb_per_s_median": mb / statistics.median(seconds), "mb_per_s_best": mb / min(seconds)}))
PY
